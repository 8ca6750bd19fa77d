"""What a pipeline's ``engine.args`` say to the vLLM engines: ``VllmArgs``, and
``VllmThinkerArgs`` (the ``vllm`` kind's)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from omni_actors.models.family import WeightsArgs

__all__ = ["VllmArgs", "VllmThinkerArgs"]


class VllmArgs(WeightsArgs):
    """A vLLM conversation engine's arguments.

    Attributes:
        model: the release: its directory, a Hugging Face repo id, or a generated
            release's name (prepared at ``seed`` in ``cache_dir``); each engine says
            what none means.
        dtype: the weights' dtype in vLLM (``auto``, ``float32``, ``bfloat16``...).
        max_model_len: the longest conversation, in tokens.
        max_num_seqs: the most requests (sessions) vLLM schedules at once.
        max_new_tokens: a reply's most tokens (a response's ``max_tokens`` overrides it).
        min_new_tokens: the end of turn is masked until that many tokens exist.
        engine_args: any further ``vllm.AsyncEngineArgs`` fields, as they are named
            there (``kv_cache_memory_bytes``, ``tensor_parallel_size``...).
        request_timeout_s: how long a request may take to end once closed before it is
            aborted.
        allowed_token_ranges: half-open ``[start, stop)`` id ranges a reply may use
            (the end of turn is always allowed); none: any. For a model whose random
            weights would pick unprintable ids (tiny-omni: printable bytes only).
        cpu_threads: on a CPU platform, the threads vLLM computes with (its engine
            process's ``OMP_NUM_THREADS``); 1, as every torch engine here, because the
            other stages share the machine; none: vLLM's choice (every core). Ignored on
            a GPU.
    """

    dtype: str = "auto"
    max_model_len: int = Field(4096, ge=16)
    max_num_seqs: int = Field(16, ge=1)
    max_new_tokens: int = Field(48, ge=1)
    min_new_tokens: int = Field(8, ge=0)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    request_timeout_s: float = Field(10.0, gt=0)
    allowed_token_ranges: list[tuple[int, int]] | None = None
    cpu_threads: int | None = Field(1, ge=1)


class VllmThinkerArgs(VllmArgs):
    """The vLLM thinker's arguments (:class:`VllmArgs`).

    Attributes:
        model: the release: its directory, a Hugging Face repo id, or a generated
            release's name (``tiny-omni``: prepared at ``seed`` in ``cache_dir``).
    """

    model: str
