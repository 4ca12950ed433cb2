"""A real vLLM pooling server (the tiny model, ``--runner pooling --convert embed``), the ``gateway serve``
whose ``vllm-pool`` runs it, and a gateway in front of it.

What ``conftest.py``'s fixtures run (one for the whole session, started by the first test that asks
for it): :func:`serve_pooling` starts ``gateway serve`` (a subprocess, as in production) with a
``vllm-pool`` of one worker, the pooling server, and yields both: the pool's gateway (model ``tiny``,
``test_real_vllm_pool_pooling.py``) and the worker's own URL (no ``/v1``), which the other pooling
tests call directly and through :func:`pooling_gateway` (a gateway with a ``vllm`` backend serving
it as model ``emb`` on every pooling endpoint). One vLLM start-up for both kinds of test. The server
renders conversations with ``chat_template.jinja`` (chat-style embeddings and ``/tokenize``). The
conftest imports this module inside its fixtures, not at its own import: this module imports the
conftest's helpers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from backends.vllm.routing.status import read_status
from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.pool.test_pool_real_vllm import STARTUP, config_text
from tests.backends.vllm.real.conftest import HERE, STAMP, VENV, _model_dir
from tests.conftest import free_port, serve_app

__all__ = ["POOLING", "SERVED", "PoolingPool", "pooling_gateway", "serve_pooling"]

SERVED = "tiny-embed"
POOLING = ("--runner", "pooling", "--convert", "embed")
ROOT = HERE.parents[3]


@dataclass(frozen=True)
class PoolingPool:
    gateway: str  # ``gateway serve`` with the pool (model ``tiny``): http://127.0.0.1:PORT
    worker: str  # the pool's one vLLM worker, directly (no /v1)


def _ready_worker(status: Path) -> str | None:
    """The worker's URL once the pool's status file says it is ready."""
    try:
        (worker,) = read_status(status).workers
    except (OSError, ValueError):
        return None
    return f"http://127.0.0.1:{worker.port}" if worker.state == "ready" else None


def serve_pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolingPool]:
    if not STAMP.exists():
        pytest.skip(f"no vLLM environment at {VENV}")
    model = _model_dir()
    root = tmp_path_factory.mktemp("vllm-pooling")
    scratch = root / "scratch"
    scratch.mkdir()
    # --chat-template: for chat-style embeddings (messages) and /tokenize of a conversation.
    args = (*POOLING, "--chat-template", str(HERE / "chat_template.jinja"))
    # The pool outlives the tests that use it (until the session ends): probed once a second and its
    # metrics read every 10 s (no test here routes on load), so it costs the rest of the run little.
    text = config_text(model, SERVED, scratch, root / "logs", "strategy: least-load, metrics_interval: 10", args)
    text = text.replace("    workers: 2\n", "    workers: 1\n")
    text = text.replace("probe: {interval: 0.5,", "probe: {interval: 1,")
    assert "probe: {interval: 1," in text and "workers: 1\n" in text, text
    config = root / "gateway.yaml"
    config.write_text(text)
    port = free_port()
    log = root / "gateway.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err,
        )  # fmt: skip
    try:
        started = time.monotonic()
        while (worker := _ready_worker(root / "logs" / "status.json")) is None:
            if proc.poll() is not None:
                raise RuntimeError(f"gateway serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() - started > STARTUP:
                raise RuntimeError(f"the pooling worker not ready after {STARTUP}s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        print(f"\nvLLM pooling server (a vllm-pool worker) ready in {time.monotonic() - started:.1f}s at {worker}")
        yield PoolingPool(f"http://127.0.0.1:{port}", worker)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)  # the gateway drains, then stops its worker
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def pooling_gateway(pooling_server: str) -> AsyncIterator[str]:
    config = f"""
server: {{host: 127.0.0.1, port: 0}}
backends:
  - {{name: real, type: vllm, base_url: {pooling_server}/v1, timeout: {{connect: 5, first_byte: 60, total: 120}}}}
models:
  - {{name: emb, routes: [{{backend: real, model: {SERVED}}}], endpoints: [embeddings, rerank]}}
"""
    app = create_app(parse_config(config, "<real pooling>", env={}))
    runner, url = await serve_app(app)
    try:
        yield url
    finally:
        await runner.cleanup()
