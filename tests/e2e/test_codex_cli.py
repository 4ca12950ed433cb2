"""The Codex CLI against the gateway, unchanged: ``codex exec`` on the ``mock`` backend completes a
task that needs one tool call (deploy/examples/codex.yaml, the set-up docs/responses.md describes).

Codex (``@openai/codex`` from npm) is installed by ``.ci/run`` under ``~/.cache/gateway-codex``
(``npm install --prefix``); the test skips, saying so, only where it is not there. The gateway runs
in-process on loopback; Codex runs as a subprocess with its own ``CODEX_HOME``, offers its usual
tools (``web_search`` among them: the example's ``builtin_tools: omit`` leaves it out), runs the
command the mock's tool call asks for, sends the output back, and ends with the mock's answer.
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

ROOT = Path(__file__).resolve().parents[2]
CACHED = Path.home() / ".cache" / "gateway-codex" / "node_modules" / ".bin" / "codex"
MARKER = "gateway-codex-ok"


def _codex() -> str | None:
    if CACHED.exists():
        return str(CACHED)
    return shutil.which("codex")


async def run_codex(url: str, model: str, prompt: str, tmp_path: Path, limit_s: float = 180) -> tuple[int, str]:
    """``codex exec PROMPT`` in a fresh ``CODEX_HOME`` whose provider is the gateway at ``url`` (Responses
    wire, ``model``): its exit status and output."""
    home = tmp_path / "codex-home"
    home.mkdir()
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
        returncode, text = await run_codex(url, model, f'run exec_command with {{"cmd": "echo {MARKER}"}}', tmp_path)
        assert returncode == 0, text
        assert f"echo {MARKER}" in text and "succeeded" in text, text  # the mock's call ran
        assert text.count(MARKER) >= 2, text  # the command and its output
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as resp:
            metrics = await resp.text()
        turns = [
            line
            for line in metrics.splitlines()
            if line.startswith("gateway_requests_total{") and 'endpoint="responses"' in line and 'status="200"' in line
        ]
        assert turns and float(turns[0].rsplit(" ", 1)[1]) >= 2  # the call, then the answer to its output
    finally:
        await runner.cleanup()
