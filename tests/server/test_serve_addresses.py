"""Where the server says it is: a URL a browser can open on every interface, and
https/wss with a certificate."""

from __future__ import annotations

import asyncio
import socket
import ssl
import urllib.request
from pathlib import Path

import pytest

from omni_actors.server.runner import run_server
from omni_actors.server.settings import ServerSettings

pytestmark = pytest.mark.asyncio


def _get(url: str, context: ssl.SSLContext | None = None) -> int:
    with urllib.request.urlopen(url, timeout=10, context=context) as response:
        status: int = response.status
        return status


async def test_on_every_interface_the_url_is_one_a_browser_can_open() -> None:
    async with run_server(ServerSettings(host="0.0.0.0", port=0), pipeline="scripted-omni") as s:
        assert s.url.startswith("http://127.0.0.1:"), s.url
        assert s.ws_url.startswith("ws://127.0.0.1:"), s.ws_url
        port = s.url.rsplit(":", 1)[1]
        assert s.network_url == f"http://{socket.gethostname()}:{port}"
        assert await asyncio.to_thread(_get, f"{s.url}/healthz") == 200
    async with run_server(ServerSettings(port=0), pipeline="scripted-omni") as s:
        assert s.network_url is None  # loopback only: nothing to tell other machines
        assert await asyncio.to_thread(_get, f"{s.url}/healthz") == 200


async def test_a_certificate_serves_https_and_wss(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    openssl = await asyncio.create_subprocess_exec(
        *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert await openssl.wait() == 0
    settings = ServerSettings(port=0, ssl_certfile=str(cert), ssl_keyfile=str(key))
    async with run_server(settings, pipeline="scripted-omni") as s:
        assert s.url.startswith("https://127.0.0.1:"), s.url
        assert s.ws_url.startswith("wss://"), s.ws_url
        trusting = ssl.create_default_context(cafile=str(cert))
        trusting.check_hostname = False  # the certificate names localhost
        assert await asyncio.to_thread(_get, f"{s.url}/healthz", trusting) == 200
