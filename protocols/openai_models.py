"""OpenAI's models API as ``GET /v1/models`` serves it: the one model a server serves.

Clients list the models first (and some check that the one they were configured with
is there), so the served model answers under its name; any other name is a 404 with
OpenAI's error body (``chat_completions.ErrorBody``).
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["Model", "ModelList"]


class Model(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/models/{id}``: a model the server serves.

    Attributes:
        id: its name (``serve``'s model name, else the pipeline's).
        created: when the server started serving it (Unix seconds).
        owned_by: who serves it (``omni-actors``).
    """

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/models``: the models the server serves (one)."""

    object: Literal["list"] = "list"
    data: list[Model]
