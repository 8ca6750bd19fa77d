"""``session.truncation``: "auto" and "disabled" are taken and shown as what runs (the
server keeps the whole conversation); a retention ratio needs its own token limit
(``test_truncation_retention.py`` drives it); what the server cannot serve is refused
by ``param``."""

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
    ("truncation", "param"),
    [
        # The server is not told the model's context length: the limit must be given.
        ({"type": "retention_ratio", "retention_ratio": 0.8}, ".token_limits.post_instructions"),
        ({"type": "retention_ratio", "retention_ratio": 0.8, "token_limits": {}},
         ".token_limits.post_instructions"),
        ({"type": "retention_ratio", "retention_ratio": 0.8,
          "token_limits": {"post_instructions": 0}}, ".token_limits.post_instructions"),
        ({"type": "retention_ratio", "retention_ratio": 1.5,
          "token_limits": {"post_instructions": 100}}, ".retention_ratio"),
        ({"type": "summary", "retention_ratio": 0.5}, ""),
        ("drop_everything", ""),
    ],
)  # fmt: skip
async def test_truncation_not_served_is_refused_by_param(
    server: RunningServer, truncation: object, param: str
) -> None:
    async with connect(server.ws_url) as client:
        await client.send("session.update", session={"truncation": truncation})
        error = await client.error()
        assert error["param"] == "session.truncation" + param
        await client.send("session.update", session={})
        assert (await client.expect("session.updated"))["session"]["truncation"] == "disabled"
