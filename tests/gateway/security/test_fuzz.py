"""Fuzzing a live ``gateway serve`` process: any body gets a 2xx or a 4xx with the error envelope,
never a 5xx or a traceback; then schemathesis checks the API against its own ``/openapi.json``.

Bounded so the suite stays fast (a few hundred examples, a few seconds) and derandomized (the
same examples every run: CI never depends on a lucky seed). A longer, random run:

    GATEWAY_FUZZ_EXAMPLES=20000 GATEWAY_FUZZ_SCHEMA_EXAMPLES=2000 GATEWAY_FUZZ_RANDOM=1 \
        .venv/bin/pytest -q tests/gateway/security/test_fuzz.py

The gateway under test has auth, limits, caps and a metrics key on, and the mock backend
behind its one model; at the end its log must hold no traceback and no secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from schemas.completions import CompletionRequest
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[3]
FUZZ_KEY = "sk-fuzzer-3e1d5c7b9a0f2468"
METRICS_KEY = "sk-fuzz-metrics-13579bdf2468"
MODEL = "fuzz-model"
EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_EXAMPLES", "250"))
SCHEMA_EXAMPLES = int(os.environ.get("GATEWAY_FUZZ_SCHEMA_EXAMPLES", "20"))
DERANDOMIZE = os.environ.get("GATEWAY_FUZZ_RANDOM") != "1"
MAX_BODY_BYTES = 65536
# Every run: no deadline (a loaded machine), no example database, the health checks off.
_FUZZ = settings(deadline=None, database=None, derandomize=DERANDOMIZE, suppress_health_check=list(HealthCheck))
AUTH = {"Authorization": f"Bearer {FUZZ_KEY}"}

CONFIG = f"""server: {{host: 127.0.0.1, drain_timeout: 1, max_prompt_array: 64, max_body_bytes: {MAX_BODY_BYTES}}}
backends: [{{name: sim, type: mock}}]
models: [{{name: {MODEL}, routes: [{{backend: sim, model: fuzz}}], endpoints: [completions, chat, embeddings, rerank]}}]
caps: {{n: 4, best_of: 4, max_tokens: 32, prompts: 4}}
auth:
  keys: [{{name: fuzzer, key: '${{FUZZ_KEY}}', rpm: 10000000, tpm: 1000000000}}]
  metrics_key: '${{FUZZ_METRICS_KEY}}'
"""


class Gateway:
    def __init__(self, url: str, log: Path) -> None:
        self.url = url
        self.log = log


@pytest.fixture(scope="module")
def live_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("fuzz")
    config = tmp / "gateway.yaml"
    config.write_text(CONFIG)
    log_path = tmp / "gateway.log"
    port = free_port()
    env = {**os.environ, "FUZZ_KEY": FUZZ_KEY, "FUZZ_METRICS_KEY": METRICS_KEY}
    cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise AssertionError(f"gateway exited: {log_path.read_text()}")
                try:
                    if httpx.get(url + "/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError("gateway did not start")
                time.sleep(0.05)
            yield Gateway(url, log_path)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- hypothesis: arbitrary JSON and near-valid requests ----------------------------------------------
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=-3, max_value=40)
    | st.floats()  # NaN and infinities too: sent as bare NaN/Infinity, which is not JSON
    | st.text(max_size=24)
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=10,
)
_small = st.one_of(
    _scalars,
    st.integers(min_value=-2, max_value=130),
    st.floats(min_value=-3, max_value=3),
    st.lists(_scalars, max_size=3),
    st.dictionaries(st.text(max_size=4), _scalars, max_size=2),
)
# Values for the schema's other fields: cheap to draw (a recursive strategy per field is slow).
_plausible: dict[str, st.SearchStrategy[Any]] = {
    name: _small for name in CompletionRequest.model_fields if name not in ("model", "prompt")
}
_near_valid = st.fixed_dictionaries(
    {
        "model": st.sampled_from([MODEL, "no-such-model", ""]) | st.text(max_size=8),
        "prompt": st.one_of(
            st.text(max_size=40),
            st.lists(st.text(max_size=10), max_size=5),
            st.lists(st.integers(min_value=-1, max_value=50_000), max_size=70),
            st.lists(st.lists(st.integers(min_value=0, max_value=100), max_size=4), max_size=5),
            _json,
        ),
    },
    optional=_plausible,
)
_bodies = st.one_of(
    _near_valid.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    _json.map(lambda v: json.dumps(v, allow_nan=True).encode()),
    st.binary(max_size=120),
    st.text(max_size=60).map(str.encode),
)
_headers = st.sampled_from(
    [AUTH, {"api-key": FUZZ_KEY}, {}, {"Authorization": "Bearer nope"}, {**AUTH, "x-request-id": "../../etc"}]
)


def _check_envelope(text: str) -> None:
    envelope = json.loads(text)
    assert set(envelope) == {"error"}
    error = envelope["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str)
    assert set(error) == {"message", "type", "param", "code"}


def _check(status: int, content_type: str, text: str) -> None:
    assert status < 500, text
    assert "Traceback" not in text
    if status >= 400:
        _check_envelope(text)
    elif "event-stream" in content_type:
        assert text.endswith("data: [DONE]\n\n")
    else:
        assert json.loads(text)["object"] == "text_completion"


def test_any_body_gets_2xx_or_an_enveloped_4xx(live_gateway: Gateway) -> None:
    with httpx.Client(base_url=live_gateway.url, timeout=10) as client:

        @settings(_FUZZ, max_examples=EXAMPLES)
        @given(body=_bodies, headers=_headers)
        def one(body: bytes, headers: dict[str, str]) -> None:
            resp = client.post("/v1/completions", content=body, headers={"Content-Type": "application/json", **headers})
            _check(resp.status_code, resp.headers.get("content-type", ""), resp.text)

        one()


# --- schemathesis: the API against its own OpenAPI document ------------------------------------------
# Schema-valid but refused is expected: cross-field rules (best_of >= n, stream_options only with
# stream, ...), request caps and the configured model names cannot be written in JSON Schema, and
# are answered 400/404 by design. Every other check runs, negative_data_rejection included.
_EXCLUDED = [schemathesis.checks.positive_data_acceptance]


def _fuzz_operation(operation: schemathesis.APIOperation, mode: GenerationMode, url: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}

    @settings(_FUZZ, max_examples=SCHEMA_EXAMPLES)
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: schemathesis.Case) -> None:
        response = case.call(base_url=url, headers=headers)
        excluded = _EXCLUDED
        if response.status_code == 413:
            # A body over max_body_bytes is refused by its size, before its content is read: a 413
            # with the envelope is the right answer, whatever schemathesis meant the body to test
            # (negative_data_rejection only knows 400/401/403/404/406/422/428/5xx).
            sent = response.request.body or b""
            size = len(sent.encode() if isinstance(sent, str) else sent)
            assert size > MAX_BODY_BYTES, f"413 for a {size}-byte body (limit {MAX_BODY_BYTES})"
            _check_envelope(response.text)
            excluded = [*_EXCLUDED, schemathesis.checks.negative_data_rejection]
        case.validate_response(response, headers=headers, excluded_checks=excluded)

    one()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_schemathesis_against_openapi(live_gateway: Gateway, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_url(live_gateway.url + "/openapi.json")
    tested = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if mode is GenerationMode.NEGATIVE and operation.method.upper() != "POST":
            continue  # the GETs take no input: nothing a client sends can be schema-invalid there
        key = METRICS_KEY if operation.path == "/metrics" else FUZZ_KEY
        _fuzz_operation(operation, mode, live_gateway.url, key)
        tested.append(operation.label)
    assert "POST /v1/completions" in tested


def test_fuzzed_gateway_logged_no_traceback_and_no_secret(live_gateway: Gateway) -> None:
    """After the runs above (same module-scoped process): its log is clean."""
    metrics = httpx.get(live_gateway.url + "/metrics", headers={"Authorization": f"Bearer {METRICS_KEY}"}).text
    assert 'gateway_requests_total{backend="_none",endpoint="completions",model="_unknown",status="500"}' not in metrics
    assert ',status="500"}' not in metrics
    log = live_gateway.log.read_text(errors="replace")
    assert "Traceback" not in log
    for secret in (FUZZ_KEY, METRICS_KEY):
        assert secret not in log
        assert secret not in metrics
