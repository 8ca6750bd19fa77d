"""Usage as the entry engine counted it: prompt tokens are the conversation a reply was
made from, completion tokens the tokens it generated, on the chat and realtime paths
(the scripted thinker counts one token per text input and per output)."""

from __future__ import annotations

from openai import AsyncOpenAI

from omni_actors.server.runner import RunningServer


def client_of(server: RunningServer) -> AsyncOpenAI:
    return AsyncOpenAI(
        base_url=server.url + "/v1",
        websocket_base_url=server.ws_url.removesuffix("/realtime"),
        api_key="unused",
        max_retries=0,
        timeout=20,
    )


async def test_chat_usage_counts_the_prompt(server: RunningServer) -> None:
    client = client_of(server)
    one = await client.chat.completions.create(
        model="scripted-omni", messages=[{"role": "user", "content": "hello"}]
    )
    assert one.usage is not None
    assert (one.usage.prompt_tokens, one.usage.completion_tokens) == (1, 32)
    assert one.usage.total_tokens == 33
    two_turns = [
        {"role": "user", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ]
    stream = await client.chat.completions.create(
        model="scripted-omni",
        messages=two_turns,  # type: ignore[arg-type]
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (3, 32, 35)


async def test_realtime_usage_grows_with_the_conversation(server: RunningServer) -> None:
    async with client_of(server).realtime.connect(model="scripted-omni") as conn:
        assert (await conn.recv()).type == "session.created"
        usages = []
        for text in ("hello", "again"):
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": text}],
                }
            )
            await conn.response.create(response={"output_modalities": ["text"]})
            async for event in conn:
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    usages.append(event.response.usage)
                    break
    first, second = usages
    assert first is not None
    assert second is not None
    assert (first.input_tokens, first.output_tokens, first.total_tokens) == (1, 32, 33)
    # The second reply's prompt is the whole conversation: both turns and the first reply.
    assert second.input_tokens == first.input_tokens + first.output_tokens + 1
    assert second.output_tokens == 32
