"""``session.truncation``: "auto" and "disabled" are taken and shown as what runs (the
server keeps the whole conversation); a retention ratio is refused by ``param``."""

from __future__ import annotations

import pytest
from realtime_client import connect

from omni_actors.server.runner import RunningServer


async def test_truncation_is_shown_as_what_runs(server: RunningServer) -> None:
    async with connect(server.ws_url) as client:
        assert client.seen[0]["session"]["truncation"] == "disabled"
        for asked in ("auto", "disabled"):
            await client.send("session.update", session={"type": "realtime", "truncation": asked})
            updated = await client.expect("session.updated")
            assert updated["session"]["truncation"] == "disabled"


@pytest.mark.parametrize(
    "truncation",
    [{"type": "retention_ratio", "retention_ratio": 0.8}, "drop_everything"],
)
async def test_truncation_not_served_is_refused_by_param(
    server: RunningServer, truncation: object
) -> None:
    async with connect(server.ws_url) as client:
        await client.send("session.update", session={"truncation": truncation})
        error = await client.error()
        assert error["param"] == "session.truncation"
        assert "auto" in error["message"]
