"""The thinker's input-embedding table, read from a checkpoint without loading the model.

The talker's inputs for text positions and generated tokens are rows of this table
(HF's Qwen3-Omni uses the thinker's ``embed_tokens`` for them), so a thinker running in
vLLM need not hand any hidden state out for text: the engine keeps the table and looks
rows up. It is one tensor of the checkpoint's safetensors (the shards its index names,
when it is sharded), every file checked first: see :mod:`omni_actors.models.files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import torch
from safetensors import safe_open

from omni_actors.errors import EngineError
from omni_actors.models.files import safetensors_weights

__all__ = ["EMBEDDING_KEY", "load_input_embeddings"]

EMBEDDING_KEY: Final = "thinker.model.embed_tokens.weight"
"""The table's name in a Qwen3-Omni checkpoint."""


def load_input_embeddings(checkpoint: Path, key: str = EMBEDDING_KEY) -> torch.Tensor:
    """The ``[vocab, hidden]`` table named ``key`` in ``checkpoint``, as float32.

    Raises:
        ModelFileError: the checkpoint's weights are missing, corrupt, or only in a
            pickle-based format (never loaded).
        EngineError: the checkpoint has no such tensor.
    """
    for file in safetensors_weights(checkpoint):
        with safe_open(str(file), framework="pt") as tensors:
            if key in tensors.keys():  # noqa: SIM118 - safe_open is no mapping
                table: torch.Tensor = tensors.get_tensor(key)
                return table.to(torch.float32)
    raise EngineError(f"{checkpoint} has no tensor {key!r} (the thinker's input embeddings)")
