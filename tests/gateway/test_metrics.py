"""``GET /metrics`` after real traffic, parsed with prometheus_client's own text parser."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.state import STATE
from tests.conftest import MOCK_MODEL, OPENAI_MODEL, VLLM_MODEL, RunningGateway, eventually
from tests.fakes import Behaviour
from tests.gateway.endpoint_labels import with_endpoint

SECRET_MODEL = "customer-secret-model-name-7781"
Labels = dict[str, str]


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


class Scrape:
    def __init__(self, text: str) -> None:
        self.text = text
        self.families = {family.name: family for family in text_string_to_metric_families(text)}
        self.samples = [sample for family in self.families.values() for sample in family.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sample ``name`` with exactly these labels (0 when absent)."""
        labels = with_endpoint(name, labels)
        found = [s.value for s in self.samples if s.name == name and s.labels == labels]
        assert len(found) <= 1
        return found[0] if found else 0.0

    def label_values(self) -> set[str]:
        return {value for sample in self.samples for value in sample.labels.values()}


async def scrape(gateway: RunningGateway, session: aiohttp.ClientSession) -> Scrape:
    async with session.get(f"{gateway.url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        return Scrape(await resp.text())


async def post(gateway: RunningGateway, session: aiohttp.ClientSession, body: dict[str, Any]) -> tuple[int, bytes]:
    async with session.post(f"{gateway.url}/v1/completions", json=body) as resp:
        return resp.status, await resp.read()


async def test_metrics_after_mixed_traffic(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    base = {"prompt": "hello", "max_tokens": 4}
    # ok, non-streaming, openai type: upstream usage prompt 3 / completion 2
    assert (await post(gateway, session, {**base, "model": OPENAI_MODEL}))[0] == 200
    assert (await post(gateway, session, {**base, "model": OPENAI_MODEL}))[0] == 200
    # 400: invalid value (rejected by the schema, before the lookup: counted under the model it names)
    assert (await post(gateway, session, {**base, "model": OPENAI_MODEL, "temperature": 3}))[0] == 400
    # 400: the same for a model nobody configured: _unknown
    assert (await post(gateway, session, {**base, "model": SECRET_MODEL, "temperature": 3}))[0] == 400
    # 404: a model name the client made up
    assert (await post(gateway, session, {**base, "model": SECRET_MODEL}))[0] == 404
    # 400 unsupported_parameter on the openai-type backend
    assert (await post(gateway, session, {**base, "model": OPENAI_MODEL, "top_k": 5}))[0] == 400
    # streams: vllm type without client usage (the gateway asks upstream anyway), mock with usage
    status, raw = await post(gateway, session, {**base, "model": VLLM_MODEL, "stream": True})
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    status, raw = await post(
        gateway, session, {**base, "model": MOCK_MODEL, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    # upstream failure: 500 -> 502, counted against the backend
    gateway.upstream.script.append(Behaviour(kind="status", status=500, body={"error": {"message": "x"}}))
    assert (await post(gateway, session, {**base, "model": VLLM_MODEL}))[0] == 502

    m = await scrape(gateway, session)

    # requests by model / backend / status
    req = "gateway_requests_total"
    assert m.value(req, model=OPENAI_MODEL, backend="up-openai", status="200") == 2
    assert m.value(req, model="_unknown", backend="_none", status="400") == 1
    assert m.value(req, model="_unknown", backend="_none", status="404") == 1
    assert m.value(req, model=OPENAI_MODEL, backend="_none", status="400") == 2
    assert m.value(req, model=VLLM_MODEL, backend="up-vllm", status="200") == 1
    assert m.value(req, model=MOCK_MODEL, backend="sim", status="200") == 1
    assert m.value(req, model=VLLM_MODEL, backend="up-vllm", status="502") == 1
    assert sum(s.value for s in m.samples if s.name == req) == 9

    # unsupported parameter, labelled by backend and parameter
    assert m.value("gateway_unsupported_parameter_rejections_total", backend="up-openai", param="top_k") == 1

    # upstream errors by backend and reason
    assert m.value("gateway_upstream_errors_total", backend="up-vllm", reason="status_500") == 1

    # tokens from upstream usage: non-streaming bodies and streams (usage chunk) alike
    assert m.value("gateway_prompt_tokens_total", model=OPENAI_MODEL, backend="up-openai") == 6
    assert m.value("gateway_completion_tokens_total", model=OPENAI_MODEL, backend="up-openai") == 4
    assert m.value("gateway_prompt_tokens_total", model=VLLM_MODEL, backend="up-vllm") == 3
    assert m.value("gateway_completion_tokens_total", model=VLLM_MODEL, backend="up-vllm") == 4
    assert m.value("gateway_prompt_tokens_total", model=MOCK_MODEL, backend="sim") == 1  # "hello": one word
    assert m.value("gateway_completion_tokens_total", model=MOCK_MODEL, backend="sim") == 4

    # time to first token: streams only
    ttft = "gateway_time_to_first_token_seconds_count"
    assert m.value(ttft, model=VLLM_MODEL, backend="up-vllm") == 1
    assert m.value(ttft, model=MOCK_MODEL, backend="sim") == 1
    assert m.value(ttft, model=OPENAI_MODEL, backend="up-openai") == 0
    assert m.value("gateway_time_to_first_token_seconds_bucket", model=VLLM_MODEL, backend="up-vllm", le="+Inf") == 1

    # the duration of every answer, refusals included, by status class: as many as gateway_requests_total
    lat = "gateway_request_duration_seconds_count"
    assert m.value(lat, model=OPENAI_MODEL, backend="up-openai", status_class="2xx") == 2
    assert m.value(lat, model=VLLM_MODEL, backend="up-vllm", status_class="2xx") == 1
    assert m.value(lat, model=VLLM_MODEL, backend="up-vllm", status_class="5xx") == 1
    assert m.value(lat, model=MOCK_MODEL, backend="sim", status_class="2xx") == 1
    assert m.value(lat, model=OPENAI_MODEL, backend="_none", status_class="4xx") == 2
    assert m.value(lat, model="_unknown", backend="_none", status_class="4xx") == 2
    assert sum(s.value for s in m.samples if s.name == lat) == 9

    # the answering upstream attempt's own time: every answer an upstream gave
    up = "gateway_upstream_duration_seconds_count"
    assert m.value(up, model=OPENAI_MODEL, backend="up-openai") == 2
    assert m.value(up, model=VLLM_MODEL, backend="up-vllm") == 1
    assert m.value(up, model=MOCK_MODEL, backend="sim") == 1
    assert sum(s.value for s in m.samples if s.name == up) == 4

    # no _created series doubling the output
    assert "_created" not in m.text

    # nothing in flight any more, every configured model present
    in_flight = {s.labels["model"]: s.value for s in m.samples if s.name == "gateway_requests_in_flight"}
    assert in_flight == {OPENAI_MODEL: 0, VLLM_MODEL: 0, MOCK_MODEL: 0}

    # a client-invented model name never becomes a label value, anywhere
    assert SECRET_MODEL not in m.text
    assert SECRET_MODEL not in m.label_values()
    assert "_unknown" in m.label_values()
    assert m.label_values() >= {OPENAI_MODEL, VLLM_MODEL, MOCK_MODEL, "up-openai", "up-vllm", "sim"}


async def test_stream_cut_counts_as_stream_failure(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    gateway.upstream.script.append(Behaviour(kind="cut", events=2))
    status, raw = await post(gateway, session, {"model": OPENAI_MODEL, "prompt": "x", "max_tokens": 8, "stream": True})
    assert status == 200 and b'"error"' in raw
    m = await scrape(gateway, session)
    assert m.value("gateway_stream_failures_total", model=OPENAI_MODEL, backend="up-openai", reason="stream_cut") == 1
    assert m.value("gateway_upstream_errors_total", backend="up-openai", reason="stream_cut") == 1
    # The HTTP status was already 200 when the cut came; the request is counted with the failure's status.
    answered = {s.labels["status"] for s in m.samples if s.name == "gateway_requests_total"}
    assert answered == {"502"}
    assert m.value("gateway_requests_in_flight", model=OPENAI_MODEL) == 0


async def test_unknown_parameter_name_is_not_a_label(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    """A field the client invents is refused by validation and never reaches a metric label."""
    invented = "invented_field_9931"
    status, _ = await post(gateway, session, {"model": OPENAI_MODEL, "prompt": "x", invented: 1})
    assert status == 400
    m = await scrape(gateway, session)
    assert invented not in m.text


async def test_metrics_before_any_traffic(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    m = await scrape(gateway, session)
    in_flight = {s.labels["model"]: s.value for s in m.samples if s.name == "gateway_requests_in_flight"}
    assert in_flight == {OPENAI_MODEL: 0, VLLM_MODEL: 0, MOCK_MODEL: 0}
    assert not [s for s in m.samples if s.name == "gateway_requests_total"]
    # in flight: a series for each endpoint a model is served on, and only those
    served = {(s.labels["model"], s.labels["endpoint"]) for s in m.samples if s.name == "gateway_requests_in_flight"}
    expected = {(name, e.value) for name, entry in gateway.app[STATE].router.models.items() for e in entry.served}
    assert served == expected
    assert (MOCK_MODEL, "chat") in served and all(e != "embeddings" for _, e in served)  # no embedding route here


async def test_time_per_output_token(gateway: RunningGateway, session: aiohttp.ClientSession) -> None:
    """A stream whose tokens come 20 ms apart: its time per output token is about 20 ms, and only streams have one."""
    gateway.upstream.script.append(Behaviour(kind="ok", delay=0.02))
    body = {"model": OPENAI_MODEL, "prompt": "x", "max_tokens": 6, "stream": True}
    status, raw = await post(gateway, session, body)
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert (await post(gateway, session, {**body, "stream": False}))[0] == 200
    m = await scrape(gateway, session)
    name = "gateway_time_per_output_token_seconds"
    assert m.value(f"{name}_count", model=OPENAI_MODEL, backend="up-openai") == 1
    per_token = m.value(f"{name}_sum", model=OPENAI_MODEL, backend="up-openai")
    assert 0.015 <= per_token <= 0.5  # 5 gaps of 20 ms over 5 tokens after the first; generous for a busy box
    assert m.value(f"{name}_bucket", model=OPENAI_MODEL, backend="up-openai", le="0.01") == 0


async def test_client_disconnect_mid_stream_cancels_upstream(
    gateway: RunningGateway, session: aiohttp.ClientSession
) -> None:
    """A client that goes away mid-stream stops the upstream's generation and is counted as 499."""
    up = gateway.upstream
    up.script.append(Behaviour(kind="stall_mid", events=1, delay=3600))  # ends only if cancelled
    resp = await session.post(
        f"{gateway.url}/v1/completions", json={"model": OPENAI_MODEL, "prompt": "x", "max_tokens": 200, "stream": True}
    )
    assert resp.status == 200
    first = await resp.content.readuntil(b"\n\n")
    assert first.startswith(b"data: {")
    resp.close()  # drop the connection with the stream half read

    await eventually(lambda: up.cancelled_streams > 0 and not up.open_streams)
    assert up.cancelled_streams == 1
    assert up.open_streams == 0

    async def answered_499() -> bool:
        m = await scrape(gateway, session)
        return bool(m.value("gateway_requests_total", model=OPENAI_MODEL, backend="up-openai", status="499"))

    await eventually(answered_499)
    m = await scrape(gateway, session)
    assert m.value("gateway_requests_total", model=OPENAI_MODEL, backend="up-openai", status="499") == 1
    assert m.value("gateway_client_disconnects_total", model=OPENAI_MODEL, backend="up-openai") == 1
    assert m.value("gateway_requests_in_flight", model=OPENAI_MODEL) == 0
    assert m.value("gateway_time_to_first_token_seconds_count", model=OPENAI_MODEL, backend="up-openai") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_while_waiting_for_upstream(
    gateway: RunningGateway, session: aiohttp.ClientSession, stream: bool
) -> None:
    """The client gives up before the upstream's first byte (no response started yet)."""
    gateway.upstream.script.append(Behaviour(kind="hold"))  # never answers: only the client gives up
    with pytest.raises(TimeoutError):
        await session.post(
            f"{gateway.url}/v1/completions",
            json={"model": OPENAI_MODEL, "prompt": "x", "stream": stream},
            timeout=aiohttp.ClientTimeout(total=0.3),
        )

    async def disconnect_counted() -> bool:
        m = await scrape(gateway, session)
        return bool(m.value("gateway_client_disconnects_total", model=OPENAI_MODEL, backend="_none"))

    await eventually(disconnect_counted)
    m = await scrape(gateway, session)
    assert m.value("gateway_client_disconnects_total", model=OPENAI_MODEL, backend="_none") == 1
    assert m.value("gateway_requests_in_flight", model=OPENAI_MODEL) == 0
    # Counted like a stream whose client left: status 499 ("client closed request").
    assert m.value("gateway_requests_total", model=OPENAI_MODEL, backend="_none", status="499") == 1
