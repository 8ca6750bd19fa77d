"""``truncation: {"type": "retention_ratio"}``: past ``token_limits.post_instructions``,
the oldest turns leave the conversation (on every stage, told by
``conversation.item.deleted``) until what stays is ``retention_ratio`` of the limit.

``item_engines.Recall`` counts a token per character of the conversation it answers
from and answers ``?`` with that conversation, so a test reads what the stages keep.
"""

from __future__ import annotations

from typing import Any

from realtime_client import RealtimeClient, connect
from test_realtime_items import _say, recall  # noqa: F401  (the fixture)

from omni_actors.server.runner import RunningServer

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot")


async def _turn(client: RealtimeClient, word: str) -> tuple[str, int, list[str]]:
    """A user item and its reply: the reply's item, the conversation's tokens through
    it (the response's usage) and the items deleted after it."""
    await _say(client, word, f"item_{word}")
    await client.send("response.create")
    events = await client.until("response.done")
    done: dict[str, Any] = events[-1]["response"]
    assert done["status"] == "completed", done
    await client.expect("rate_limits.updated")
    deleted: list[str] = []
    await client.send("conversation.item.retrieve", item_id=f"item_{word}")
    while (event := await client.recv())["type"] != "conversation.item.retrieved":
        assert event["type"] == "conversation.item.deleted", event
        deleted.append(event["item_id"])
    return done["output"][0]["id"], done["usage"]["total_tokens"], deleted


async def _kept(client: RealtimeClient) -> str:
    """What the stages hold, asked out of band (the answer stays out of it)."""
    await _say(client, "?", f"item_q{len(client.seen)}")
    await client.send("response.create", response={"conversation": "none"})
    events = await client.until("response.done")
    return "".join(
        e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta"
    )


async def test_past_the_limit_the_oldest_turns_go_until_the_ratio_is_kept(
    recall: RunningServer,  # noqa: F811
) -> None:
    limit, ratio = 60, 0.8
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await client.send(
            "session.update",
            session={"truncation": {"type": "retention_ratio", "retention_ratio": ratio,
                                    "token_limits": {"post_instructions": limit}}},
        )  # fmt: skip
        shown = (await client.expect("session.updated"))["session"]["truncation"]
        assert shown == {
            "type": "retention_ratio",
            "retention_ratio": ratio,
            "token_limits": {"post_instructions": limit},
        }
        replies: list[str] = []
        totals: list[int] = []
        for word in WORDS:
            reply, total, deleted = await _turn(client, word)
            replies.append(reply)
            totals.append(total)
            if total <= limit:
                assert deleted == []
                continue
            # The reference: drop through the oldest reply after which what stays fits.
            cut = next(j for j in range(len(totals) - 1) if total - totals[j] <= ratio * limit)
            expected = [x for i in range(cut + 1) for x in (f"item_{WORDS[i]}", replies[i])]
            assert deleted == expected, (totals, deleted)
            break
        else:
            raise AssertionError(f"the conversation never passed {limit} tokens: {totals}")
        kept = await _kept(client)
        first_kept = WORDS[cut + 1]
        assert kept.startswith(f"u:{first_kept} a:{first_kept.upper()}"), kept
        assert f"u:{WORDS[cut]} " not in kept
        # The dropped items are gone from what the server holds, too.
        await client.send("conversation.item.retrieve", item_id=f"item_{WORDS[0]}")
        assert (await client.error())["code"] == "item_retrieve_invalid_item_id"


async def test_within_the_limit_nothing_goes(recall: RunningServer) -> None:  # noqa: F811
    async with connect(recall.ws_url) as client:
        await client.no_vad()
        await client.send(
            "session.update",
            session={"truncation": {"type": "retention_ratio", "retention_ratio": 0.8,
                                    "token_limits": {"post_instructions": 10_000}}},
        )  # fmt: skip
        await client.expect("session.updated")
        for word in WORDS[:3]:
            _, _, deleted = await _turn(client, word)
            assert deleted == []
        assert (await _kept(client)).startswith("u:alpha a:ALPHA u:bravo")
