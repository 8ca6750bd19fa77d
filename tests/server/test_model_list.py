"""``/v1/models`` through the official ``openai`` client: the served model is listed and
retrieved; any other id, or a wrong key, is refused with OpenAI's error body. One rule
for model names: another model is refused alike on chat completions and realtime."""

from __future__ import annotations

import json
import time

import openai
import pytest
import websockets
from http_client import get, post
from openai import AsyncOpenAI
from realtime_client import connect
from websockets.exceptions import InvalidStatus

from omni_actors.server.runner import RunningServer, run_server
from omni_actors.server.settings import ServerSettings


def client_of(server: RunningServer, key: str = "unused") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=20)


async def test_the_served_model_is_listed(server: RunningServer) -> None:
    client = client_of(server)
    page = await client.models.list()
    [model] = page.data
    assert model.id == "scripted-omni"  # the pipeline's name: no model name was set
    assert (model.object, model.owned_by) == ("model", "omni-actors")
    assert 0 < model.created <= time.time()
    assert await client.models.retrieve("scripted-omni") == model


async def test_an_unknown_model_is_a_404_with_an_error_body(server: RunningServer) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client_of(server).models.retrieve("gpt-4o")
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body["type"], body["code"], body["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    assert "'gpt-4o'" in body["message"]
    assert "'scripted-omni'" in body["message"]


async def test_the_model_name_setting_and_the_key_apply() -> None:
    settings = ServerSettings(preset="scripted-omni", port=0, model="my-omni", api_key="k")
    async with run_server(settings) as server:
        [model] = (await client_of(server, key="k").models.list()).data
        assert model.id == "my-omni"
        with pytest.raises(openai.AuthenticationError):
            await client_of(server, key="wrong").models.list()
        status, body = await get(server.url + "/v1/models")
        assert status == 401
        assert body["error"]["code"] == "invalid_api_key"


async def test_an_unknown_model_gets_one_answer_on_every_route(server: RunningServer) -> None:
    # As vLLM answers: a 404 with OpenAI's error body, the same on every route.
    with pytest.raises(openai.NotFoundError) as listed:
        await client_of(server).models.retrieve("gpt-4o")
    with pytest.raises(openai.NotFoundError) as chatted:
        await client_of(server).chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
        )
    assert chatted.value.body == listed.value.body
    with pytest.raises(InvalidStatus) as refused:
        async with websockets.connect(server.ws_url + "?model=gpt-4o"):
            pass
    assert refused.value.response.status_code == 404
    assert refused.value.response.body is not None
    assert json.loads(refused.value.response.body)["error"] == listed.value.body
    async with connect(server.ws_url + "?model=scripted-omni") as conn:  # the served one
        await conn.send("session.update", session={"type": "realtime", "model": "gpt-4o"})
        error = await conn.error()
        assert (error["code"], error["param"]) == ("model_not_found", "session.model")
        assert error["message"] == listed.value.body["message"]  # type: ignore[index]


async def test_a_request_naming_no_model_gets_the_served_one() -> None:
    settings = ServerSettings(preset="scripted-omni", port=0, model="my-omni")
    async with run_server(settings) as server:
        status, body = await post(
            server.url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}]},
            {},
        )
        assert status == 200
        assert body["model"] == "my-omni"
        status, body = await post(
            server.url + "/v1/chat/completions",
            {"model": "scripted-omni", "messages": [{"role": "user", "content": "hi"}]},
            {},
        )
        assert (status, body["error"]["code"]) == (404, "model_not_found")
