"""``gateway check-config --probe`` and the start-up warning against a real HTTP server on a local port
that serves the OpenAI/vLLM model list at ``/v1/models`` only (as vLLM does): a ``base_url`` written
without ``/v1`` is named with the URL to write, a route's model the server does not list is named
with the nearest listed id, a backend nobody listens for is listed as unreachable."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.cli import main
from gateway.configfile import parse_config
from gateway.probe import probe, probe_in_background, shown_url
from tests.conftest import free_port, serve_app


def _app() -> web.Application:
    async def models(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer sk-probe-key":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        return web.json_response({"object": "list", "data": [{"id": "Qwen/Qwen2.5-0.5B", "object": "model"}]})

    async def chat(request: web.Request) -> web.Response:
        model = (await request.json())["model"]
        return web.json_response(
            {"error": {"message": f"The model `{model}` does not exist.", "code": 404}}, status=404
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)  # anything else: aiohttp's own 404
    app.router.add_post("/v1/chat/completions", chat)  # as vLLM answers a model it does not serve
    return app


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """A real server in its own thread and loop (the CLI runs its own loop): its ``http://127.0.0.1:port``."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(url: str) -> str:
    down = f"http://127.0.0.1:{_closed_port()}/v1"
    return f"""
backends:
  - {{name: good, type: vllm, base_url: "{url}/v1", api_key: sk-probe-key}}
  - {{name: no-v1, type: vllm, base_url: "{url}", api_key: sk-probe-key}}
  - {{name: typo, type: openai, base_url: "{url}/v1", api_key: sk-probe-key}}
  - {{name: down, type: openai, base_url: "{down}", timeout: {{connect: 2}}}}
  - {{name: sim, type: mock}}
models:
  - name: chat
    routes:
      - {{backend: good, model: Qwen/Qwen2.5-0.5B}}
      - {{backend: no-v1, model: Qwen/Qwen2.5-0.5B}}
      - {{backend: typo, model: Qwen/Qwen2.5-05B}}
      - {{backend: down, model: m}}
      - {{backend: sim, model: m}}
"""


def test_check_config_probe_names_each_problem(server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(_config(server))
    assert main(["check-config", str(path), "--probe"]) == 1
    out, err = capsys.readouterr()
    assert "OK (5 backends, 1 models)" in out
    lines = err.splitlines()
    assert lines[0] == f"{path}: the probe found 3 problem(s):"
    assert lines[1] == (
        f"  no-v1: base_url {server} answers 404 on /models but {server}/v1/models answers: "
        f"set base_url to {server}/v1 (every request would fail as not found)"
    )
    assert lines[2] == (
        f"  typo: models[0].routes[2].model: 'Qwen/Qwen2.5-05B' is not listed by {server}/v1/models; "
        "did you mean 'Qwen/Qwen2.5-0.5B'? (listed: Qwen/Qwen2.5-0.5B)"
    )
    assert lines[3].startswith("  down: http://127.0.0.1:") and "is unreachable: " in lines[3]
    assert len(lines) == 4
    assert "sk-probe-key" not in out + err


def test_a_config_the_backends_agree_with_passes(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(
        f'backends: [{{name: v, type: vllm, base_url: "{server}/v1/", api_key: sk-probe-key}}]\n'
        "models: [{name: chat, routes: [{backend: v, model: Qwen/Qwen2.5-0.5B}]}]\n"
    )
    assert main(["check-config", "--probe", str(path)]) == 0
    assert "probe: every remote backend answered as configured" in capsys.readouterr().out


async def test_refused_credentials_and_the_start_up_warning(server: str, caplog: pytest.LogCaptureFixture) -> None:
    config = parse_config(
        f'backends: [{{name: v, type: openai, base_url: "{server}/v1", api_key: wrong-key}}]\n'
        "models: [{name: chat, routes: [{backend: v, model: Qwen/Qwen2.5-0.5B}]}]\n",
        env={},
    )
    [finding] = await probe(config)
    assert (finding.backend, finding.kind) == ("v", "status")
    assert "refused the gateway's credentials (401)" in finding.message
    caplog.set_level(logging.WARNING, logger="gateway.probe")
    await probe_in_background(config, "gw.yaml")
    warned = [r.getMessage() for r in caplog.records]
    assert warned[0].startswith("start-up probe: gw.yaml: v: ") and "(401)" in warned[0]
    assert warned[1] == (
        "start-up probe: 1 problem(s) (gateway check-config --probe gw.yaml lists them); serving anyway"
    )


async def test_a_404_for_the_path_is_upstream_misconfigured_not_model_not_found(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = parse_config(
        f"""
backends:
  - {{name: no-v1, type: openai, base_url: "{server}", api_key: sk-probe-key}}
  - {{name: good, type: openai, base_url: "{server}/v1", api_key: sk-probe-key}}
models:
  - {{name: lost, routes: [{{backend: no-v1, model: Qwen/Qwen2.5-0.5B}}]}}
  - {{name: unknown, routes: [{{backend: good, model: nope}}]}}
""",
        env={},
    )
    runner, url = await serve_app(create_app(config))
    try:
        async with aiohttp.ClientSession() as session:
            answers = []
            for model in ("lost", "unknown"):
                body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    answers.append((resp.status, (await resp.json())["error"]))
    finally:
        await runner.cleanup()
    (status, error), (status2, error2) = answers
    assert status == 502 and error["code"] == "upstream_misconfigured", error
    assert error["message"].startswith(
        "backend 'no-v1' answered 404 for POST /chat/completions (the path, not the model): "
        "its base_url is likely wrong"
    )
    assert "127.0.0.1" not in error["message"]  # the client is told no host; the log names it
    assert any(f"POST {server}/chat/completions answered 404 for the path" in r.getMessage() for r in caplog.records)
    assert status2 == 502 and error2["code"] == "upstream_model_not_found", error2


async def test_gateway_serve_logs_what_the_probe_finds_and_serves_anyway(server: str, tmp_path: Path) -> None:
    """The start-up warning, as ``gateway serve`` runs it: beside serving, never stopping it."""
    port = free_port()
    path = tmp_path / "gw.yaml"
    path.write_text(
        f"server: {{port: {port}}}\n"
        f'backends: [{{name: no-v1, type: openai, base_url: "{server}", api_key: sk-probe-key}},\n'
        "           {name: s, type: mock}]\n"
        "models: [{name: m, routes: [{backend: no-v1, model: Qwen/Qwen2.5-0.5B}, {backend: s, model: m}]}]\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(path),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(30):
            while not any("serving anyway" in line for line in lines):
                line = (await proc.stderr.readline()).decode()
                assert line, "gateway exited: " + "".join(lines)
                lines.append(line)
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/health") as resp:
            assert resp.status == 200
    finally:
        proc.terminate()
        await proc.wait()
    [warning] = [line for line in lines if "start-up probe: " in line and "no-v1: base_url" in line]
    assert f"WARNING gateway.probe: start-up probe: {path}: no-v1: base_url {server} answers 404" in warning
    assert "sk-probe-key" not in "".join(lines)


def test_urls_are_shown_without_credentials() -> None:
    assert shown_url("https://user:pw@vllm.internal:8000/v1/") == "https://vllm.internal:8000/v1"
