"""The short fault run of issue 13: hostile upstream + hostile clients + SIGTERM under load.

    .venv/bin/python -m tests.soak.fault_run                     # about 15 s
    FAULT_RUN_SECONDS=120 FAULT_RUN_WORKERS=48 .venv/bin/python -m tests.soak.fault_run

A real ``gateway serve`` subprocess with auth on (one key with rpm/tpm/concurrency limits, a
metrics key, the audit log) fronts one ``tests.fakes.FakeUpstream`` through two backends:
``fine`` (a well-behaved route) and ``wild`` (the same upstream in the hostile modes of
``tests.soak.hostile``: gzip bombs, endless bodies and events, double ``[DONE]``, SSE fields,
read-then-close, the upstream key echoed in error bodies, integers past 2^64, ...). Workers,
each on one keep-alive connection, send a mix of both for ``FAULT_RUN_SECONDS``; beside them,
hostile clients (one per probe of ``tests.soak.hostile.probes``) send theirs on their own connections.
About a third of the workers' requests are chat (``/v1/chat/completions``, half of them offering
tools), meeting the same modes in chat shapes plus the chat-only ones (tool-call floods, an error
event, a malformed chunk, ...); the hostile clients send chat probes too.
Then SIGTERM, with the load still running through the drain.

It fails (exit status 1, or the test ``tests/gateway/test_fault_run.py``) on any of:
- a 500, a status outside the clean set, an error without the OpenAI envelope, a stream that does
  not end in exactly one ``[DONE]`` or relays a non-``data:`` line, a ``fine`` answer that is not
  the upstream's whole answer, an out-of-range integer refused without naming its field;
- a traceback in the gateway's stderr (its log and audit log) or in an answer;
- a secret (the gateway key, the upstream key, the metrics key, or any 12 characters of one) in
  an answer, its headers, the log or ``/metrics``;
- the gateway's peak RSS (VmHWM) over ``FAULT_RUN_RSS_MB`` (default 300; a gzip bomb inflated
  once would pass 1 GB);
- a lost request: a request on a connection opened before the listener closed that got no
  answer (a reset, a hang); a fresh connection refused or reset once the listener closed is a
  refusal, as a client would see it during a rolling update;
- the gateway not exiting 0 after the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.conftest import free_port
from tests.fakes import FakeUpstream
from tests.soak.hostile import CHAT_MODES, MODES, Probe, gzip_bomb, probes, send_probe, upstream_chooser

__all__ = ["FaultReport", "run_fault"]

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_KEY = "sk-fr-gateway-5c1e9a7b3d2f4680aa"
UPSTREAM_KEY = "sk-fr-upstream-2b4d6f8a0c1e3579bb"
METRICS_KEY = "sk-fr-metrics-9a8b7c6d5e4f3021cc"
SECRETS = (GATEWAY_KEY, UPSTREAM_KEY, METRICS_KEY)
DRAIN_DELAY = 1.0
CLEAN = {200, 400, 401, 403, 408, 413, 415, 429, 502, 503, 504}
CHAT_TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

CONFIG = """
server: {{host: 127.0.0.1, port: {port}, drain_timeout: 10, drain_delay: {delay}, audit_log: true,
          max_body_bytes: 65536, client_body_timeout: 5}}
backends:
  - name: clean
    type: openai
    base_url: '{url}'
    api_key: '${{FR_UPSTREAM_KEY}}'
    timeout: {{connect: 1, first_byte: 5, total: 8, stream_idle: 3}}
  - name: hostile
    type: openai
    base_url: '{url}'
    api_key: '${{FR_UPSTREAM_KEY}}'
    timeout: {{connect: 1, first_byte: 1, total: 2, stream_idle: 1}}
    limits: {{max_response_bytes: 1048576, max_event_bytes: 65536}}
    circuit_breaker: {{enabled: false}}
models:
  - {{name: fine, routes: [{{backend: clean, model: up-fine}}]}}
  - {{name: wild, routes: [{{backend: hostile, model: up-wild}}]}}
auth:
  keys: [{{name: faulty, key: '${{FR_GATEWAY_KEY}}', rpm: 10000000, tpm: 1000000000, max_concurrent: 512}}]
  metrics_key: '${{FR_METRICS_KEY}}'
"""


def _fragments(secret: str, width: int = 12) -> list[bytes]:
    return [secret[i : i + width].encode() for i in range(len(secret) - width + 1)]


FRAGMENTS = [f for s in SECRETS for f in _fragments(s)]


def leaked(data: bytes) -> bool:
    return any(f in data for f in FRAGMENTS)


@dataclass
class FaultReport:
    seconds: float = 0.0
    outcomes: Counter[str] = field(default_factory=Counter)
    probes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    during_drain: int = 0
    refused: int = 0
    rss_base_mb: float = 0.0
    rss_peak_mb: float = 0.0
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        answered = sum(self.outcomes.values())
        return "\n".join([
            f"{answered} requests on kept connections + {sum(self.probes.values())} hostile-client probes"
            f" in {self.seconds:.1f}s; {self.during_drain} answered during the drain, {self.refused} workers"
            " refused after the listener closed",
            "outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
            "probes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.probes.items())),
            f"gateway RSS: {self.rss_base_mb:.0f} MB after warm-up, peak {self.rss_peak_mb:.0f} MB;"
            f" exit {self.exit_code}",
            f"failures: {len(self.failures)}",
            *(f"  {f}" for f in self.failures[:20]),
        ])  # fmt: skip


def _status_mb(pid: int, field_name: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _text(choice: dict[str, Any], chat: bool) -> str:
    if not chat:
        return str(choice["text"])
    part = choice.get("message") or choice.get("delta") or {}
    return str(part.get("content") or "")


def check_answer(
    model: str, mode: str, stream: bool, status: int, raw: bytes, headers: str, chat: bool = False
) -> str | None:
    """What is wrong with one answer, or None."""
    if leaked(raw) or leaked(headers.encode()):
        return f"secret in the answer: {raw[:200]!r}"
    if b"Traceback" in raw:
        return "traceback in the answer"
    if status not in CLEAN:
        return f"status {status}: {raw[:200]!r}"
    if status != 200 or not stream:
        obj = orjson.loads(raw)
        if status != 200:
            if not isinstance(obj.get("error"), dict) or set(obj["error"]) != {"message", "type", "param", "code"}:
                return f"status {status} without the envelope: {raw[:200]!r}"
            return None if model == "wild" else f"fine request refused: {status} {raw[:200]!r}"
        if model == "fine" and [_text(c, chat) for c in obj["choices"]] != [" hello world"]:
            return f"fine answer altered: {raw[:200]!r}"
        return None
    if not raw.endswith(b"data: [DONE]\n\n") or raw.count(b"[DONE]") != 1:
        return f"stream without exactly one final [DONE] ({mode}): {raw[-120:]!r}"
    events = [e for e in raw.split(b"\n\n") if e]
    if any(not e.startswith(b"data: ") or b"\n" in e for e in events):
        return f"a non-data line relayed ({mode}): {raw[:200]!r}"
    objs = [orjson.loads(e[6:]) for e in events[:-1]]
    if any("error" in o for o in objs[:-1]):
        return "an error event before the end"
    if model == "fine":
        if objs and "error" in objs[-1]:
            return f"fine stream ended in an error: {objs[-1]}"
        if (
            "".join(_text(o["choices"][0], chat) for o in objs) != "".join(f" t{i}" for i in range(len(objs)))
            or len(objs) != 8
        ):
            return f"fine stream altered: {raw[:200]!r}"
    return None


class Run:
    def __init__(self, port: int, seconds: float, seed: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.report = FaultReport()
        self.stop = asyncio.Event()
        self.listener_closed = asyncio.Event()  # a worker saw the listener closed (refused)
        self.signalled: float | None = None
        self.in_flight: dict[int, str] = {}  # worker -> what it waits for (to name a hang)

    def after_listener_closed(self, t: float) -> bool:
        return self.signalled is not None and t >= self.signalled + DRAIN_DELAY - 0.05

    async def worker(self, n: int) -> None:
        rng = random.Random(self.rng.random())
        auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1), headers=auth) as session:
            fresh = True  # the next request opens a new connection
            while not self.stop.is_set():
                wild = rng.random() < 0.4
                chat = rng.random() < 0.35
                mode = rng.choice(MODES + CHAT_MODES if chat else MODES) if wild else "ok"
                model = "wild" if wild else "fine"
                stream = rng.random() < 0.5 if not mode.endswith("_stream") and mode not in CHAT_MODES else True
                text = f"wild:{mode}" if wild else "hi"
                body: dict[str, Any] = {"model": model, "max_tokens": 8, "stream": stream}
                if chat:
                    body["messages"] = [{"role": "user", "content": text}]
                    if rng.random() < 0.5 or mode.startswith("tool_"):
                        body["tools"] = CHAT_TOOLS
                else:
                    body["prompt"] = text
                path = "/v1/chat/completions" if chat else "/v1/completions"
                model_tag = f"chat-{model}" if chat else model
                sent = time.monotonic()
                self.in_flight[n] = f"{model_tag}/{mode} stream={stream}"
                try:
                    async with session.post(self.url + path, json=body, timeout=timeout) as resp:
                        closing = resp.headers.get("Connection", "").lower() == "close"
                        if mode == "endless_events" and resp.status == 200:
                            # Valid events without end: nothing bounds a stream's length but its client
                            # (and the drain deadline), so this client reads a while and walks away.
                            raw = await resp.content.read(256 * 1024)
                            resp.close()
                            self.report.outcomes[f"{model_tag}:endless_events/left"] += 1
                            del self.in_flight[n]
                            fresh = True
                            continue
                        raw = await resp.read()
                except aiohttp.ClientConnectorError as exc:
                    # When the failure is seen, not when the request was started: a refusal only
                    # happens after the gateway's delay, so a slow machine sees it later, never sooner.
                    if self.after_listener_closed(time.monotonic()):
                        self.report.refused += 1
                        self.listener_closed.set()
                        return
                    self.report.failures.append(f"connect failed before the listener closed: {exc!r}")
                    return
                except (TimeoutError, aiohttp.ClientError) as exc:
                    if fresh and self.after_listener_closed(time.monotonic()):
                        self.report.refused += 1  # in the listen backlog when the listener closed
                        self.listener_closed.set()
                        return
                    self.report.failures.append(f"lost request ({model_tag}/{mode}, stream={stream}): {exc!r}")
                    return
                problem = check_answer(model, mode, stream, resp.status, raw, str(resp.headers), chat)
                if problem is not None:
                    self.report.failures.append(f"{path}: {problem}")
                self.report.outcomes[f"{model_tag}:{mode}/{resp.status}" if wild else f"{model_tag}/{resp.status}"] += 1
                if self.signalled is not None and sent > self.signalled + 0.05:
                    self.report.during_drain += 1
                fresh = closing
                del self.in_flight[n]

    async def hostile_client(self, probe: Probe) -> None:
        while not self.stop.is_set() and self.signalled is None:
            try:
                status, raw = await send_probe(self.port, probe)
            except OSError as exc:
                if self.signalled is None:
                    self.report.failures.append(f"probe {probe.name}: {exc!r}")
                return
            self.report.probes[f"{probe.name}/{status}"] += 1
            problem = self.check_probe(probe, status, raw)
            if problem is not None and self.signalled is None:
                self.report.failures.append(f"probe {probe.name}: {problem}")

    @staticmethod
    def check_probe(probe: Probe, status: int | None, raw: bytes) -> str | None:
        if leaked(raw):
            return f"secret in the answer: {raw[:300]!r}"
        if status not in probe.allowed:
            return f"status {status}, expected one of {sorted(probe.allowed)}: {raw[:300]!r}"
        if status == 200:
            return None
        body = raw.partition(b"\r\n\r\n")[2]
        try:
            error = orjson.loads(body)["error"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return f"no JSON envelope: {raw[:300]!r}"
        if probe.name.startswith("int-2^64") and not error.get("param"):
            return f"out-of-range integer refused without naming the field: {error}"
        return None

    async def watch_rss(self, pid: int) -> None:
        while not self.stop.is_set():
            self.report.rss_peak_mb = max(self.report.rss_peak_mb, _status_mb(pid, "VmHWM"))
            await asyncio.sleep(0.2)

    async def metrics(self) -> None:
        headers = {"Authorization": f"Bearer {METRICS_KEY}"}
        async with aiohttp.ClientSession() as session, session.get(self.url + "/metrics", headers=headers) as resp:
            text = await resp.read()
        if resp.status != 200:
            self.report.failures.append(f"/metrics answered {resp.status}")
        if leaked(text):
            self.report.failures.append("secret in /metrics")
        for line in text.splitlines():
            if line.startswith(b"gateway_requests_total{") and b'status="500"' in line and not line.endswith(b" 0.0"):
                self.report.failures.append(f"a 500 counted: {line.decode()}")


async def _healthy(url: str, proc: asyncio.subprocess.Process, within: float) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as probe:
        while True:
            if proc.returncode is not None:
                raise RuntimeError("the gateway exited at start-up")
            try:
                async with probe.get(url + "/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway did not become healthy")
            await asyncio.sleep(0.05)


async def run_fault(
    seconds: float = 6.0, workers: int = 16, bomb_mb: int = 100, rss_ceiling_mb: float = 300
) -> FaultReport:
    up = FakeUpstream()
    await up.start()
    up.default = upstream_chooser(UPSTREAM_KEY, gzip_bomb(bomb_mb))
    port = free_port()
    run = Run(port, seconds, seed=int(os.environ.get("FAULT_RUN_SEED", "1")))
    report = run.report
    tmp = Path(tempfile.mkdtemp(prefix="fault-run-"))
    (tmp / "gateway.yaml").write_text(CONFIG.format(port=port, delay=DRAIN_DELAY, url=up.url))
    env = {**os.environ, "FR_GATEWAY_KEY": GATEWAY_KEY, "FR_UPSTREAM_KEY": UPSTREAM_KEY, "FR_METRICS_KEY": METRICS_KEY}
    log_path = tmp / "gateway.log"
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(tmp / "gateway.yaml"),
            cwd=ROOT, env=env, stdout=log, stderr=log,
        )  # fmt: skip
    try:
        await _healthy(run.url, proc, within=30)
        auth = {"Authorization": f"Bearer {GATEWAY_KEY}"}
        async with aiohttp.ClientSession(headers=auth) as warm:
            for stream in (False, True):
                body = {"model": "fine", "prompt": "w", "max_tokens": 8, "stream": stream}
                async with warm.post(run.url + "/v1/completions", json=body) as resp:
                    await resp.read()
        report.rss_base_mb = _status_mb(proc.pid, "VmRSS")
        started = time.monotonic()
        watcher = asyncio.create_task(run.watch_rss(proc.pid))
        tasks = [asyncio.create_task(run.worker(n)) for n in range(workers)]
        tasks += [asyncio.create_task(run.hostile_client(probe)) for probe in probes(GATEWAY_KEY)]
        await asyncio.sleep(seconds)
        await run.metrics()
        report.rss_peak_mb = max(report.rss_peak_mb, _status_mb(proc.pid, "VmHWM"))
        run.signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        # The load goes on through the drain and past the listener's close: until a worker has seen
        # it closed (an event, not a sleep a slow machine could outlast), bounded.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.listener_closed.wait(), timeout=DRAIN_DELAY + 60)
        run.stop.set()
        _, pending = await asyncio.wait([*tasks, watcher], timeout=30)
        for task in pending:
            task.cancel()
        if pending:
            report.failures.append(f"hung after the drain: {sorted(run.in_flight.values())}")
        report.exit_code = await asyncio.wait_for(proc.wait(), timeout=20)
        report.seconds = time.monotonic() - started
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await up.stop()
    log_text = log_path.read_bytes()
    if report.exit_code != 0:
        report.failures.append(f"gateway exit status {report.exit_code}")
    if b"Traceback" in log_text:
        at = log_text.index(b"Traceback")
        report.failures.append(f"traceback in the gateway log: {log_text[at : at + 600]!r}")
    if leaked(log_text):
        report.failures.append("secret in the gateway log")
    if b'"status":500' in log_text.replace(b" ", b""):
        report.failures.append("a 500 in the audit log")
    if report.rss_peak_mb > rss_ceiling_mb:
        report.failures.append(f"gateway peak RSS {report.rss_peak_mb:.0f} MB over {rss_ceiling_mb:.0f} MB")
    if not report.refused:
        report.failures.append("no worker saw the listener close")
    if report.ok:
        shutil.rmtree(tmp)
    else:
        report.failures.append(f"gateway log kept at {log_path}")
    return report


def main() -> int:
    report = asyncio.run(
        run_fault(
            seconds=float(os.environ.get("FAULT_RUN_SECONDS", "6")),
            workers=int(os.environ.get("FAULT_RUN_WORKERS", "16")),
            bomb_mb=int(os.environ.get("FAULT_RUN_BOMB_MB", "100")),
            rss_ceiling_mb=float(os.environ.get("FAULT_RUN_RSS_MB", "300")),
        )
    )
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
