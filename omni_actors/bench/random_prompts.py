"""Random prompts of an exact length in tokens (``bench pipeline --input-tokens N``).

Serving benchmarks such as vLLM's (``--dataset-name random``) measure a model on prompts
of a set length: token ids drawn at random from the vocabulary, decoded to text. The
thinker takes text, so a prompt here is that text, and its length is what counts: the
tokens the thinker prefills for it, which is the entry stage's own tokenizer encoding
the text on its own (:meth:`~omni_actors.actors.engines.qwen3_omni.vocabulary.Vocabulary.encode`,
as the thinker encodes a text chunk). The chat template's few tokens around a user
turn come on top, as they do for vLLM's chat requests.

Decoded random ids do not always encode back to as many tokens (neighbours merge, a
byte of a character decodes to a replacement character). vLLM re-encodes a few times
and accepts being off by some tokens; here the length is exact:

- ids are drawn from the tokens that are text of their own
  (:meth:`~omni_actors.actors.engines.qwen3_omni.vocabulary.Vocabulary.text_ids`), so the
  text of any draw is whole characters;
- the text is re-encoded until it has exactly ``N`` tokens: when merges left fewer, the
  shortfall is drawn and appended; when more, the ids are cut to ``N``, and each further
  round also draws a longer tail anew (a tail that grows whenever it is decoded would
  otherwise come back every round).

Prompt ``i`` depends only on the seed, ``i``, ``N`` and the tokenizer: every run, and
every concurrency level of a run, sends the same prompts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING

from omni_actors.errors import OmniError
from omni_actors.models.cache import locate
from omni_actors.models.family import family_of_kind
from omni_actors.pipeline.spec.pipeline import PipelineSpec

if TYPE_CHECKING:
    from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary

__all__ = ["PromptLengthError", "RandomPrompts", "entry_vocabulary"]

_ROUNDS = 64
"""Re-encodings before giving up; a prompt of real or generated vocabulary takes one to
three."""


class PromptLengthError(OmniError, ValueError):
    """Random prompts of the length asked for cannot be made: a length below 1, an entry
    stage whose tokenizer is unknown, or a vocabulary with no token that is text."""


class RandomPrompts:
    """Seeded random prompts of exactly ``tokens`` tokens of ``vocabulary`` (module
    docstring).

    Args:
        vocabulary: the entry stage's (:func:`entry_vocabulary`).
        tokens: each prompt's length in tokens.
        seed: prompt ``i`` is the same for the same seed.

    Raises:
        PromptLengthError: ``tokens`` is below 1, or no token of ``vocabulary`` is text.
    """

    def __init__(self, vocabulary: Vocabulary, tokens: int, seed: int = 0) -> None:
        if tokens < 1:
            raise PromptLengthError(f"a prompt needs at least 1 token, got {tokens}")
        self.vocabulary = vocabulary
        self.tokens = tokens
        self.seed = seed
        self._pool = vocabulary.text_ids()
        if not self._pool:
            raise PromptLengthError("the tokenizer has no token that is text of its own")

    def text(self, index: int) -> str:
        """Prompt ``index``: text that encodes to exactly :attr:`tokens` tokens.

        Raises:
            PromptLengthError: no such text came of the draws (never seen with a real
                or generated Qwen3-Omni vocabulary).
        """
        n, pool = self.tokens, self._pool
        rng = random.Random(f"{self.seed}:{n}:{index}")
        ids = rng.choices(pool, k=n)
        for round_ in range(_ROUNDS):
            text = self.vocabulary.decode(ids)
            got = self.vocabulary.encode(text)
            if len(got) == n:
                return text
            if len(got) < n:
                ids = got + rng.choices(pool, k=n - len(got))
            else:
                redrawn = min(round_, n)
                ids = got[: n - redrawn] + rng.choices(pool, k=redrawn)
        raise PromptLengthError(
            f"prompt {index} did not come to {n} tokens in {_ROUNDS} rounds of re-encoding; "
            "try another --seed or --input-tokens"
        )

    def texts(self, count: int) -> list[str]:
        """Prompts ``0 .. count - 1``."""
        return [self.text(i) for i in range(count)]


def entry_vocabulary(spec: PipelineSpec) -> Vocabulary:
    """The text vocabulary of ``spec``'s entry stage: its release's tokenizer.

    The entry stage's engine names its release by its ``model`` argument (or its
    family's default model), prepared with its ``seed`` in its ``cache_dir``: where a
    Qwen3-Omni thinker, torch or vLLM, reads its tokenizer.

    Raises:
        PromptLengthError: the entry stage loads no model (a scripted pipeline).
        ModelFileError: the release has no tokenizer and chat template a Qwen3-Omni
            thinker reads.
        ModelNotPreparedError: the release is a family's and is not prepared.
    """
    from omni_actors.actors.engines.qwen3_omni.vocabulary import Vocabulary

    stage = spec.stage(spec.entry_stage)
    args = stage.engine.args
    model = args.get("model")
    if model is None:
        family = family_of_kind(stage.engine.kind)
        model = None if family is None else family.default_model
    if not isinstance(model, str):
        raise PromptLengthError(
            f"pipeline {spec.name}: its entry stage {stage.name} ('{stage.engine.kind}' "
            "engine) loads no model, so it has no tokenizer to count prompt tokens with; "
            "--input-tokens needs a model preset (e.g. --preset tiny-omni)"
        )
    seed = args.get("seed", 0)
    cache_dir = args.get("cache_dir")
    path = locate(
        model,
        cache_dir=None if cache_dir is None else Path(str(cache_dir)),
        seed=seed if isinstance(seed, int) else 0,
        prefixes=("thinker.",),  # a Hub repo: the shards the thinker fetches anyway
    )
    return Vocabulary.load(path)
