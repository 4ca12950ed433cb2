"""Error answers quote client input at a bounded length (issue 13, class "unbounded sizes").

A model name, an unknown field's name or a logit_bias key of 200 KB used to come back whole in
the message (an unknown field twice: message and ``param``), and into the log with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config

CONFIG = """
backends: [{name: sim, type: mock}]
models: [{name: m, routes: [{backend: sim, model: m}]}]
"""
LONG = 200_000


@pytest.fixture
async def url() -> AsyncIterator[str]:
    runner = web.AppRunner(create_app(parse_config(CONFIG, "<test>", env={})))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1/completions"
    await runner.cleanup()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "m", "prompt": "x", "logit_bias": {"a" * LONG: 1}}, 400, "logit_bias"),
        ({"model": "q" * LONG, "prompt": "x"}, 404, "model"),
        ({"model": "m", "prompt": "x", "z" * LONG: 1}, 400, None),
    ],
    ids=["logit_bias-key", "model-name", "unknown-field"],
)
async def test_client_input_is_echoed_at_a_bounded_length(
    url: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    async with aiohttp.ClientSession() as session, session.post(url, data=orjson.dumps(body)) as resp:
        raw = await resp.read()
    assert resp.status == status
    error = orjson.loads(raw)["error"]
    assert len(raw) < 3000
    assert len(error["message"]) <= 2048 + 40 and "more characters" in error["message"]
    if param is not None:
        assert error["param"] == param
    else:
        assert error["param"] is None or len(error["param"]) <= 256 + 40
