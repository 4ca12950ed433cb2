"""The Codex CLI against the gateway, unchanged: ``codex exec`` completes a task that needs one tool
call on the ``mock`` backend (deploy/examples/codex.yaml, the set-up docs/responses.md describes) and
on every other backend type, each over its simulated native server (``tests.e2e.model_upstreams``).

Codex (``@openai/codex`` from npm) is installed by ``.ci/run`` under ``~/.cache/gateway-codex``
(``npm install --prefix``); the test skips, saying so, only where it is not there. The gateway runs
in-process on loopback; Codex runs as a subprocess with its own ``CODEX_HOME``, offers its usual
tools (``web_search`` among them: the example's ``builtin_tools: omit`` leaves it out), runs the
command the mock's tool call asks for, sends the output back, and ends with the mock's answer.

The other backend types' servers run the same simulator behind their own wire (``openai``: a native
``/v1/responses`` stream; ``vllm`` and ``vllm-pool``: chat, the path a vLLM's Responses take at any
version; ``tgi``, ``llamacpp``: OpenAI-shaped chat; ``ollama``: ``/api/chat`` NDJSON with argument
objects): the first turn calls Codex's ``exec_command`` with the ``{"cmd": ...}`` the task names, the
turn that carries the command's output gets a text answer. Their Codex runs go concurrently.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import serve_app
from tests.e2e.model_upstreams import start_responses_gateway

ROOT = Path(__file__).resolve().parents[2]
CACHED = Path.home() / ".cache" / "gateway-codex" / "node_modules" / ".bin" / "codex"
MARKER = "gateway-codex-ok"
TASK = f'run exec_command with {{"cmd": "echo {MARKER}"}}'
# Every backend type but ``mock`` (the test of codex.yaml serves that one).
KINDS = ("openai", "vllm", "tgi", "ollama", "llamacpp", "vllm-pool")


def _codex() -> str | None:
    if CACHED.exists():
        return str(CACHED)
    return shutil.which("codex")


async def run_codex(url: str, model: str, prompt: str, tmp_path: Path, limit_s: float = 180) -> tuple[int, str]:
    """``codex exec PROMPT`` in a fresh ``CODEX_HOME`` whose provider is the gateway at ``url`` (Responses
    wire, ``model``): its exit status and output."""
    home = tmp_path / "codex-home"
    home.mkdir(parents=True)
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "gateway"\n\n[model_providers.gateway]\nname = "gateway"\n'
        f'base_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "GATEWAY_API_KEY"\n'
    )
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "CODEX_HOME": str(home), "GATEWAY_API_KEY": "unused", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        str(_codex()), "exec", "--skip-git-repo-check", prompt, cwd=work, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=limit_s)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


@pytest.mark.slow
@pytest.mark.skipif(_codex() is None, reason="the Codex CLI is not installed (.ci/run installs it with npm)")
async def test_codex_exec_completes_a_task_with_one_tool_call(tmp_path: Path) -> None:
    config = yaml.safe_load((ROOT / "deploy" / "examples" / "codex.yaml").read_text())
    config["server"]["port"] = 0
    model = config["models"][0]["name"]  # the example's first model is the one Codex names
    app = create_app(parse_config(yaml.safe_dump(config), "<codex.yaml>", env={}))
    runner, url = await serve_app(app)
    try:
        returncode, text = await run_codex(url, model, TASK, tmp_path)
        assert_task_done(returncode, text)
        assert await responses_turns(url, model) == 2  # the call, then the answer to its output
    finally:
        await runner.cleanup()


def assert_task_done(returncode: int, text: str) -> None:
    """Codex ended well after running the command the model's tool call asked for."""
    assert returncode == 0, text
    assert f"echo {MARKER}" in text and "succeeded" in text, text
    assert text.count(MARKER) >= 2, text  # the command and its output


async def responses_turns(url: str, model: str, backend: str | None = None) -> float:
    """The Responses turns ``/metrics`` counts as served (200) for ``model`` (on ``backend``)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
        metrics = await resp.text()
    labels = ['endpoint="responses"', f'model="{model}"', 'status="200"']
    labels += [f'backend="{backend}"'] if backend else []
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("gateway_requests_total{") and all(label in line for label in labels)
    )


@pytest.mark.slow
@pytest.mark.skipif(_codex() is None, reason="the Codex CLI is not installed (.ci/run installs it with npm)")
async def test_codex_exec_completes_the_task_on_every_backend_type(tmp_path: Path) -> None:
    omit = "responses: {builtin_tools: omit}"  # the one line docs/responses.md gives for Codex
    models = "".join(f"  - {{name: codex-{k}, routes: [{{backend: b-{k}, model: up-{k}}}], {omit}}}\n" for k in KINDS)
    async with start_responses_gateway(models) as gateway:
        runs = await asyncio.gather(*(run_codex(gateway.url, f"codex-{k}", TASK, tmp_path / k) for k in KINDS))
        for kind, (returncode, text) in zip(KINDS, runs, strict=True):
            assert_task_done(returncode, text)
            assert await responses_turns(gateway.url, f"codex-{kind}", f"b-{kind}") == 2, kind
            if kind != "openai":  # the simulated servers' answer to a tool result, which Codex ends with
                assert "Tool said:" in text, text
        for kind, upstream in gateway.upstreams.items():  # what Codex's turns became on each native wire
            call, answer = upstream.requests
            assert call["stream"] is True and answer["stream"] is True, kind
            offered = [tool["function"]["name"] for tool in call["tools"]]
            assert "exec_command" in offered and "web_search" not in offered, (kind, offered)
            *_, assistant, result = answer["messages"]
            assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["exec_command"], kind
            assert result["role"] == "tool" and MARKER in result["content"], kind  # the output reached the model
