"""A GPU stage's output crosses to the host only in the fields its host-bound outlets take.

The thinker's first output carries the talker's rows and embeddings beside its text; the
talker on the same device takes them as device tensors, and the caller takes the text
alone. A host copy of the whole output would make the caller's first text wait for the
rows' copy (and for the step that made them). ``meta`` tensors stand for the GPU's; the
transfers count what they were asked to copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch

from omni_actors.actors.stage.session import StageSession


class Transfers:
    """``to_host`` counted: a device tensor's host copy is zeros of its shape."""

    def __init__(self) -> None:
        self.copies: list[dict[str, tuple[int, ...]]] = []

    async def to_host(self, fields: Mapping[str, Any]) -> dict[str, Any]:
        self.copies.append(
            {k: tuple(v.shape) for k, v in fields.items() if isinstance(v, torch.Tensor)}
        )
        return {
            k: torch.zeros(v.shape) if isinstance(v, torch.Tensor) else v for k, v in fields.items()
        }


class Outlet:
    """An outlet as ``_route`` sees it: what it was pushed, in its fields, by device."""

    def __init__(self, fields: set[str], *, takes_device: bool) -> None:
        self.fields = frozenset(fields)
        self.takes_device = takes_device
        self.copy_wait = 0.0
        self.pushed: list[dict[str, str]] = []

    def push(self, output: Mapping[str, Any]) -> None:
        self.pushed.append(
            {
                k: v.device.type if isinstance(v, torch.Tensor) else v
                for k, v in output.items()
                if k in self.fields
            }
        )


def first_output() -> dict[str, Any]:
    return {
        "text": "Hi",
        "token_ids": torch.tensor([7]),
        "embed": torch.empty(1, 64, device="meta"),
        "user": torch.empty(2500, 64, device="meta"),
    }


async def test_the_callers_text_goes_without_copying_rows_a_device_peer_takes() -> None:
    talker = Outlet({"embed", "user", "text"}, takes_device=True)
    client = Outlet({"text", "token_ids"}, takes_device=False)
    transfers = Transfers()
    stage = SimpleNamespace(outlets=[talker, client], transfers=transfers)
    await StageSession._route(stage, first_output())  # type: ignore[arg-type]
    assert transfers.copies == []
    assert client.pushed == [{"text": "Hi", "token_ids": "cpu"}]
    assert talker.pushed == [{"text": "Hi", "embed": "meta", "user": "meta"}]


async def test_host_outlets_share_one_copy_of_the_fields_they_take() -> None:
    peer = Outlet({"embed", "text"}, takes_device=False)  # a stage in another process
    client = Outlet({"text"}, takes_device=False)
    transfers = Transfers()
    stage = SimpleNamespace(outlets=[peer, client], transfers=transfers)
    await StageSession._route(stage, first_output())  # type: ignore[arg-type]
    assert transfers.copies == [{"embed": (1, 64)}]  # not the 2500 rows no one takes
    assert peer.pushed == [{"text": "Hi", "embed": "cpu"}]
    assert client.pushed == [{"text": "Hi"}]


async def test_routing_to_some_outlets_copies_what_those_take() -> None:
    peer = Outlet({"embed"}, takes_device=False)
    client = Outlet({"text"}, takes_device=False)
    transfers = Transfers()
    stage = SimpleNamespace(outlets=[peer, client], transfers=transfers)
    await StageSession._route(stage, first_output(), iter([client]))  # type: ignore[arg-type]
    assert transfers.copies == []
    assert (peer.pushed, client.pushed) == ([], [{"text": "Hi"}])
