"""``/v1/models`` through the official ``openai`` client: the served model is listed and
retrieved; any other id, or a wrong key, is refused with OpenAI's error body."""

from __future__ import annotations

import time

import openai
import pytest
from http_client import get
from openai import AsyncOpenAI

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
