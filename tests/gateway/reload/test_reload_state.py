"""A reload in a running gateway (issue 15): what carries over and what is closed, and when.

The app is the one ``create_app`` builds, served like ``gateway serve`` serves it, with
:func:`gateway.reload.enable_reload` on a config file; each test rewrites the file and calls
the reloader (what the SIGHUP handler calls). Backends named in the first config are
:class:`tests.fakes.ScriptedBackend` s (``type: mock`` placeholders); a backend a reload
builds is a real one from the registry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from backends.errors import UpstreamConnectError
from gateway.app import create_app
from gateway.configfile import load_config
from gateway.reload import Reloader, enable_reload
from gateway.state import STATE
from tests.conftest import eventually, serve_app
from tests.fakes import Reply, ScriptedBackend

BREAKER = "{consecutive_failures: 1, failure_rate: null, cooldown: 600}"


def config(backends: list[str], models: list[str], server: str = "") -> str:
    return (
        f"server: {{host: 127.0.0.1, port: 0{', ' + server if server else ''}}}\n"
        "backends:\n" + "".join(f"  - {b}\n" for b in backends) + "models:\n" + "".join(f"  - {m}\n" for m in models)
    )


@dataclass
class Running:
    url: str
    app: web.Application
    reloader: Reloader
    path: Path
    fakes: dict[str, ScriptedBackend]
    session: aiohttp.ClientSession

    async def post(self, model: str, **fields: Any) -> tuple[int, dict[str, Any] | bytes]:
        body = {"model": model, "prompt": "hi", "max_tokens": 2, **fields}
        async with self.session.post(self.url + "/v1/completions", json=body) as resp:
            if fields.get("stream"):
                return resp.status, await resp.read()
            return resp.status, await resp.json()

    async def reload(self, text: str) -> bool:
        self.path.write_text(text)
        return await self.reloader.reload()

    def metric(self, name: str, **labels: str) -> float | None:
        return self.app[STATE].metrics.registry.get_sample_value(name, labels)


Start = Callable[[str], Awaitable[Running]]


@pytest.fixture
async def start(tmp_path: Path) -> AsyncIterator[Start]:
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def _start(text: str) -> Running:
        path = tmp_path / "gateway.yaml"
        path.write_text(text)
        cfg = load_config(path)
        fakes = {b.name: ScriptedBackend(b.name) for b in cfg.backends}
        app = create_app(cfg, backends=fakes)
        reloader = enable_reload(app, path)
        runner, url = await serve_app(app)
        session = aiohttp.ClientSession()
        cleanups.append(runner.cleanup)
        cleanups.append(session.close)
        return Running(url, app, reloader, path, fakes, session)

    yield _start
    for cleanup in reversed(cleanups):
        await cleanup()


async def test_an_open_breaker_of_an_unchanged_backend_stays_open(start: Start) -> None:
    down = f"{{name: down, type: mock, circuit_breaker: {BREAKER}}}"
    gw = await start(config([down, "{name: sim, type: mock}"], ["{name: m, routes: [{backend: down, model: x}]}"]))
    gw.fakes["down"].default = Reply.fail(UpstreamConnectError("refused", backend="down"))
    status, _ = await gw.post("m")
    assert status == 502
    assert gw.metric("gateway_circuit_state", backend="down") == 2  # open
    calls = len(gw.fakes["down"].calls)

    # Same section for ``down``; a new model on a new route.
    assert await gw.reload(
        config(
            [down, "{name: sim, type: mock}"],
            ["{name: m, routes: [{backend: down, model: x}]}", "{name: n, routes: [{backend: sim, model: y}]}"],
        )
    )
    status, body = await gw.post("m")
    assert status == 503 and isinstance(body, dict)
    assert body["error"]["code"] == "no_healthy_upstream"  # still open: refused without a call
    assert len(gw.fakes["down"].calls) == calls
    assert gw.app[STATE].backends["down"] is gw.fakes["down"]  # the same object, not closed
    assert not gw.fakes["down"].closed
    assert gw.metric("gateway_circuit_state", backend="down") == 2
    status, _ = await gw.post("n")
    assert status == 200  # the new model serves


async def test_a_changed_backend_section_gets_a_new_backend_and_breaker(start: Start) -> None:
    down = f"{{name: down, type: mock, circuit_breaker: {BREAKER}}}"
    gw = await start(config([down], ["{name: m, routes: [{backend: down, model: x}]}"]))
    gw.fakes["down"].default = Reply.fail(UpstreamConnectError("refused", backend="down"))
    assert (await gw.post("m"))[0] == 502

    changed = "{name: down, type: mock, circuit_breaker: {consecutive_failures: 2, failure_rate: null}}"
    assert await gw.reload(config([changed], ["{name: m, routes: [{backend: down, model: x}]}"]))
    status, _ = await gw.post("m")
    assert status == 200  # a real mock backend now, behind a fresh (closed) breaker
    assert gw.app[STATE].backends["down"] is not gw.fakes["down"]
    await eventually(lambda: gw.fakes["down"].closed)  # nothing was in flight on the old one


async def test_a_removed_backend_is_closed_after_its_in_flight_stream_ends(start: Start) -> None:
    gw = await start(config(["{name: old, type: mock}"], ["{name: m, routes: [{backend: old, model: x}]}"]))
    old = gw.fakes["old"]
    stalled = Reply.stalled()
    old.queue(stalled)
    in_flight = asyncio.create_task(gw.post("m", stream=True))
    await eventually(lambda: old.active == 1)

    assert await gw.reload(config(["{name: new, type: mock}"], ["{name: m, routes: [{backend: new, model: x}]}"]))
    status, body = await gw.post("m")  # new requests take the new route at once
    assert status == 200 and isinstance(body, dict) and body["model"] == "m"
    assert len(old.calls) == 1
    await asyncio.sleep(0.2)
    assert not old.closed  # its stream is still in flight

    stalled.release()
    status, raw = await in_flight
    assert status == 200 and isinstance(raw, bytes)
    assert b" old1" in raw and raw.endswith(b"data: [DONE]\n\n") and b'"error"' not in raw
    await eventually(lambda: old.closed)
    # Metrics continue in the same registry: the old backend's series keep their value, the new one grows.
    assert gw.metric("gateway_requests_total", model="m", backend="old", status="200", endpoint="completions") == 1
    assert gw.metric("gateway_requests_total", model="m", backend="new", status="200", endpoint="completions") == 1


async def test_an_invalid_config_keeps_the_old_one_and_logs_each_yaml_path(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await start(config(["{name: a, type: mock}"], ["{name: m, routes: [{backend: a, model: x}]}"]))
    caplog.set_level(logging.INFO, logger="gateway.reload")
    bad = config(
        ["{name: a, type: mock, token_delay_ms: -1}", "{name: b, type: nosuch}"],
        ["{name: m, routes: [{backend: a, model: x}]}"],
    )
    assert not await gw.reload(bad)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    text = "\n".join(r.getMessage() for r in errors)
    assert "backends[0].token_delay_ms:" in text
    assert "backends[1].type:" in text or "backends[1]:" in text
    assert all(r.exc_info is None for r in errors)  # no traceback
    assert (await gw.post("m"))[0] == 200
    assert gw.reloader.reloads == 0


async def test_a_new_listener_is_refused_with_restart_needed(start: Start, caplog: pytest.LogCaptureFixture) -> None:
    gw = await start(config(["{name: a, type: mock}"], ["{name: m, routes: [{backend: a, model: x}]}"]))
    caplog.set_level(logging.INFO, logger="gateway.reload")
    moved = config(["{name: b, type: mock}"], ["{name: m, routes: [{backend: b, model: x}]}"], server="port: 1")
    assert not await gw.reload(moved)
    text = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert "server.port:" in text and "restart" in text
    # Nothing of the refused file applied: the old route still serves.
    assert gw.app[STATE].backends.keys() == {"a"}
    assert len(gw.fakes["a"].calls) == 0
    assert (await gw.post("m"))[0] == 200
    assert len(gw.fakes["a"].calls) == 1


async def test_live_server_keys_apply(start: Start) -> None:
    gw = await start(config(["{name: a, type: mock}"], ["{name: m, routes: [{backend: a, model: x}]}"]))
    before = gw.app[STATE].admission
    assert await gw.reload(
        config(["{name: a, type: mock}"], ["{name: m, routes: [{backend: a, model: x}]}"], "admission: {queue_size: 0}")
    )
    state = gw.app[STATE]
    assert state.admission is not before and state.admission.limiter.queue_size == 0
    assert state.backends["a"] is gw.fakes["a"]
