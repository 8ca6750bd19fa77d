"""``Spec``: the base of every part of a pipeline definition."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Spec"]


class Spec(BaseModel):
    """The base of every part of a pipeline definition: strict, frozen.

    Numbers are finite: YAML's ``.inf`` (or ``1e400``, read as infinity) is no deadline,
    count or size, and ``.nan`` compares false with every bound.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )
