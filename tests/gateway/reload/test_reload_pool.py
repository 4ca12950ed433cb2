"""A reload next to a ``vllm-pool`` of stand-in workers (issue 15): an unchanged pool section keeps
the pool, its supervisor and its worker processes; a change applied in place (a timing) keeps them
too; a key only a restart applies (the shared transport's) is refused by its YAML path, and the
workers keep serving. Rollouts: test_reload_rollout.py."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import aiohttp
import pytest

from backends.vllm.pool import VLLMPoolBackend
from gateway.app import create_app
from gateway.configfile import load_config
from gateway.reload import enable_reload
from gateway.state import STATE
from tests.backends.vllm.pool.conftest import MODEL, live_pids_with, pool_yaml, port_range, wait_for, wait_no_pids
from tests.conftest import serve_app


def _config(pool: str, extra_models: str = "") -> str:
    return (
        "server: {host: 127.0.0.1, port: 0}\n"
        f"backends:\n{pool}  - {{name: sim, type: mock}}\n"
        f"models:\n  - {{name: m, routes: [{{backend: pool, model: {MODEL}}}]}}\n{extra_models}"
    )


async def test_an_unchanged_or_retimed_pool_keeps_its_workers_and_a_transport_change_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tag = f"pooltest-{uuid.uuid4().hex[:12]}"
    ports = port_range()
    pool_section = pool_yaml(tag, tmp_path / "logs", ports=ports)
    path = tmp_path / "gateway.yaml"
    path.write_text(_config(pool_section))
    app = create_app(load_config(path))
    reloader = enable_reload(app, path)
    runner, url = await serve_app(app)
    try:
        pool = app[STATE].backends["pool"]
        assert isinstance(pool, VLLMPoolBackend)
        await wait_for(lambda: any(ep.available for ep in pool.dispatcher.endpoints), what="a ready worker")
        pids = sorted(live_pids_with(tag))
        assert pids

        path.write_text(_config(pool_section, "  - {name: n, routes: [{backend: sim, model: x}]}\n"))
        assert await reloader.reload()
        assert app[STATE].backends["pool"] is pool
        assert sorted(live_pids_with(tag)) == pids  # the same vLLM processes
        async with aiohttp.ClientSession() as session:
            for model in ("m", "n"):
                body = {"model": model, "prompt": "hi", "max_tokens": 2}
                async with session.post(url + "/v1/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()

            path.write_text(_config(pool_yaml(tag, tmp_path / "logs", ports=ports, stop_timeout=3)))
            assert await reloader.reload()  # in place
            assert app[STATE].backends["pool"] is pool and pool.supervisor.config.stop_timeout == 3
            assert sorted(live_pids_with(tag)) == pids

            caplog.set_level(logging.INFO, logger="gateway.reload")
            path.write_text(_config(pool_yaml(tag, tmp_path / "logs", ports=ports, stop_timeout=3, max_connections=9)))
            assert not await reloader.reload()
            errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
            assert "backends[0].max_connections: 'pool': max_connections changed" in errors and "restart" in errors
            assert app[STATE].backends["pool"] is pool
            assert sorted(live_pids_with(tag)) == pids
            body = {"model": "m", "prompt": "hi", "max_tokens": 2}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()
    assert not wait_no_pids(tag)
