"""A real vLLM pooling server (the tiny model, ``--runner pooling --convert embed``) and a gateway in front of it.

What ``conftest.py``'s fixtures run (one server for the whole session, started by the first test
that asks for it): :func:`serve_pooling` (the server's URL, no ``/v1``) and :func:`pooling_gateway`
(a gateway serving it as model ``emb`` on every pooling endpoint). The server renders conversations
with ``chat_template.jinja`` (chat-style embeddings and ``/tokenize``). The conftest imports this
module inside its fixtures, not at its own import: this module imports the conftest's helpers.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import HERE, STAMP, VENV, _model_dir, _wait_healthy, stop_server, vllm_env
from tests.conftest import free_port, serve_app

__all__ = ["SERVED", "pooling_gateway", "serve_pooling"]

SERVED = "tiny-embed"


def serve_pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not STAMP.exists():
        pytest.skip(f"no vLLM environment at {VENV}")
    model = _model_dir()
    scratch = tmp_path_factory.mktemp("vllm-pooling")
    port = free_port()
    env = {**os.environ, **vllm_env(scratch)}
    args = [
        str(VENV / "bin" / "python"), str(HERE / "launch_vllm.py"), "serve", str(model),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--runner", "pooling", "--convert", "embed",
        "--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--kv-cache-memory-bytes", "64M",
        "--chat-template", str(HERE / "chat_template.jinja"),  # for chat-style embeddings (messages)
    ]  # fmt: skip
    log = scratch / "vllm.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = time.monotonic()
        _wait_healthy(url, proc, log)
        print(f"\nvLLM pooling server ready in {time.monotonic() - started:.1f}s at {url}")
        yield url
    finally:
        stop_server(proc)


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
