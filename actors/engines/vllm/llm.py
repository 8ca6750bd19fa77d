"""``VllmLlmEngine`` (kind ``cascade.llm-vllm``): the cascade's LLM on vLLM.

A text causal LM (Qwen3, Llama, ...: any release vLLM serves) as the conversation
engine the cascade's ``llm`` stage runs: it takes and yields what ``cascade.llm`` (the
torch engine) does, the user's turns as text, turn marks and instructions in, one
``token_ids`` and ``text`` per reply token out, with the same conversation. The
conversation is :class:`~.engine.VllmConversationEngine`'s, which the vLLM thinker
shares (one open vLLM request per session, prefilled as input arrives; rollbacks
reopen it over the whole conversation, which vLLM's prefix cache serves).

Without a ``model`` it loads tiny-cascade's LLM (``llm/`` of the prepared release), as
``cascade.llm`` does; a directory laid out as a whole cascade is read the same way.
Greedy replies never pick an id past the tokenizer's (Qwen3's embedding is padded past
it), as ``cascade.llm``'s do.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from omni_actors.actors.engines.cascade.family import stage_checkpoint
from omni_actors.actors.engines.cascade.llm_engine import LLM_INPUTS, LLM_OUTPUTS
from omni_actors.actors.engines.contract import Rule
from omni_actors.actors.engines.vllm.args import VllmArgs
from omni_actors.errors import EngineError, MissingExtraError
from omni_actors.models.files import read_json

from .engine import VllmConversationEngine

__all__ = ["VllmLlmArgs", "VllmLlmEngine"]

if importlib.util.find_spec("vllm") is None:  # vLLM itself is imported where it runs
    raise MissingExtraError("the cascade.llm-vllm engine", "vllm", ModuleNotFoundError(name="vllm"))


class VllmLlmArgs(VllmArgs):
    """The LLM's arguments on vLLM (:class:`~.args.VllmArgs`); ``model`` none: the
    ``llm/`` of tiny-cascade, prepared at ``seed`` in ``cache_dir``."""


class VllmLlmEngine(VllmConversationEngine):
    """Text replies to text turns on vLLM (see the module docstring).

    Inputs per chunk: ``text`` (str), ``instructions`` (str), or a turn mark. Outputs per
    reply token: ``token_ids`` [1] int64 and ``text`` (what the token adds to the
    reply's text).
    """

    kind: ClassVar[str] = "cascade.llm-vllm"
    Args: ClassVar[type[VllmLlmArgs]] = VllmLlmArgs
    inputs: ClassVar[Mapping[str, Rule]] = LLM_INPUTS
    outputs: ClassVar[Mapping[str, Rule]] = LLM_OUTPUTS

    def _checkpoint(self) -> Path:
        return stage_checkpoint(self.args, "llm")

    async def _load(self, path: Path) -> None:
        config = read_json(path / "config.json")
        text = config.get("text_config", config)
        if not isinstance(text.get("vocab_size"), int):
            raise EngineError(f"{path / 'config.json'} has no vocab_size: not a causal LM's")
        self.vocab_size = text["vocab_size"]
        for start, stop in self.args.allowed_token_ranges or ():
            if not 0 <= start < stop <= self.vocab_size:
                raise EngineError(
                    f"allowed_token_ranges has [{start}, {stop}), which is empty or outside "
                    f"the LLM's vocabulary [0, {self.vocab_size})"
                )

    def _allowed_ids(self) -> list[int] | None:
        # Rows past the tokenizer pad the embedding (Qwen3's 151936 against its
        # tokenizer's 151669): no text has them, so no reply may pick them.
        spelled = len(self.tokenizer)
        ranges = self.args.allowed_token_ranges
        if ranges is None:
            if spelled >= self.vocab_size:
                return None
            ranges = [(0, spelled)]
        allowed = {i for start, stop in ranges for i in range(start, min(stop, spelled))}
        return sorted(allowed | self.stop_ids)
