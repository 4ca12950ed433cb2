"""Soak: thousands of requests through the gateway while the upstreams fail at random.

    .venv/bin/python -m tests.soak.soak                       # 5000 requests, 64 at a time (about a minute)
    .venv/bin/python -m tests.soak.soak --requests 20000 --concurrency 128 --seed 7 --max-seconds 600

Everything runs in this process on loopback: three fake upstreams (``tests.fakes``) whose
answers are drawn at random (errors, 429s, resets, cuts, stalls, garbage, error events,
slow streams), one of them refusing connections for a moment now and then; the real
gateway app (``create_app``) with failover, retries, circuit breakers, a bulkhead and
admission control; and a client that also walks away from some requests midway.

Every answer is checked: a complete, correct completion (non-streaming: the upstream's
text under the client's model name; streaming: every chunk in order, the last one with
its ``finish_reason``, then ``[DONE]``), or a clean error (an OpenAI error envelope with
a 4xx/5xx status other than 500, or a stream ending in an error event and ``[DONE]``).
A hang (no answer within ``--hang-after`` seconds), a truncated or malformed answer, or a
500 is a failure. Afterwards, with the client gone: no request in flight at the upstreams,
no slot or queue entry held at the gateway, every request counted exactly once in
``gateway_requests_total``, handler tasks, file descriptors and idle upstream connections
back to their level after the warm-up, and RSS growth within ``--max-rss-growth-mb``.

The run stops sending new requests after ``--max-seconds``. Exit status 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import random
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.configfile import parse_config
from gateway.state import STATE
from tests.fakes import Behaviour, FakeUpstream

__all__ = ["SoakReport", "run_soak"]

CONFIG = """
server:
  host: 127.0.0.1
  port: 0
  admission: {{max_in_flight: {max_in_flight}, queue_size: 256, queue_timeout: 2}}
backends:
  - name: a
    type: openai
    base_url: '{up0}'
    timeout: {timeout}
    retry: {{attempts: 2, backoff_base: 0.01, backoff_max: 0.05, jitter: 0.01, max_retry_after: 0.05}}
    circuit_breaker: {{consecutive_failures: 8, failure_rate: 0.9, window: 50, min_requests: 20, cooldown: 0.3}}
  - name: b
    type: vllm
    base_url: '{up1}'
    timeout: {timeout}
    max_concurrency: 8
    retry: {{attempts: 2, backoff_base: 0.01, backoff_max: 0.05, jitter: 0.01}}
    circuit_breaker: {{consecutive_failures: 8, cooldown: 0.3}}
  - name: c
    type: openai
    base_url: '{up2}'
    timeout: {timeout}
    circuit_breaker: {{consecutive_failures: 5, cooldown: 0.3}}
    health_check: {{interval: 0.2, timeout: 0.5}}
models:
  - name: spread
    strategy: round_robin
    routes: [{{backend: a, model: up-a}}, {{backend: b, model: up-b}}, {{backend: c, model: up-c}}]
  - name: weighted
    strategy: weighted
    routes: [{{backend: a, model: up-a, weight: 3}}, {{backend: b, model: up-b}}]
  - name: least
    strategy: least_outstanding
    routes: [{{backend: b, model: up-b}}, {{backend: c, model: up-c}}]
  - name: solo
    routes: [{{backend: a, model: up-a}}]
"""
TIMEOUT = "{connect: 0.5, first_byte: 1.0, total: 3, stream_idle: 0.5}"
MODELS = ("spread", "weighted", "least", "solo")
CLEAN_ERROR_STATUSES = {400, 429, 502, 503, 504}


def chaos(rng: random.Random) -> Any:
    """The fake upstreams' answer to a request nobody scripted: mostly fine, often not."""
    weighted: list[tuple[float, Any]] = [
        (55, lambda: Behaviour()),
        (7, lambda: Behaviour(kind="ok", delay=0.005)),
        (5, lambda: Behaviour(kind="status", status=rng.choice([500, 502, 503, 504]), body={"error": {}})),
        (3, lambda: Behaviour(kind="status", status=429, body={"error": {"message": "slow"}},
                              headers={"Retry-After": rng.choice(["0", "1"])})),
        (2, lambda: Behaviour(kind="status", status=400, body={"error": {"message": "bad prompt"}})),
        (5, lambda: Behaviour(kind="reset")),
        (5, lambda: Behaviour(kind="cut", events=rng.randint(0, 3))),
        (3, lambda: Behaviour(kind="stall", delay=rng.uniform(0.1, 1.3))),
        (3, lambda: Behaviour(kind="stall_mid", events=rng.randint(1, 3), delay=0.7)),
        (2, lambda: Behaviour(kind="garbage")),
        (3, lambda: Behaviour(kind="error_event", events=rng.randint(0, 2))),
        (2, lambda: Behaviour(kind="garbage_event", events=rng.randint(0, 2))),
    ]  # fmt: skip
    total = sum(w for w, _ in weighted)

    def pick(body: dict[str, Any]) -> Behaviour:
        x = rng.uniform(0, total)
        for weight, make in weighted:
            x -= weight
            if x <= 0:
                return make()  # type: ignore[no-any-return]
        return Behaviour()

    return pick


@dataclass
class SoakReport:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    rss_growth_mb: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [
            f"{self.sent} requests in {self.seconds:.1f}s ({self.sent / max(self.seconds, 1e-9):.0f}/s)",
            "outcomes: " + ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items())),
            f"RSS growth after warm-up: {self.rss_growth_mb:.1f} MB",
            *(f"{k}: {v}" for k, v in self.details.items()),
            f"failures: {len(self.failures)}",
            *(f"  {f}" for f in self.failures[:20]),
        ]
        return "\n".join(lines)


def _rss_mb() -> float:
    try:
        with open(f"/proc/{os.getpid()}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # not Linux: peak RSS is the best we have
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _fds() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def _check_completion(model: str, raw: bytes) -> str | None:
    obj = orjson.loads(raw)
    if obj.get("object") != "text_completion" or obj.get("model") != model:
        return f"bad completion object: {raw[:200]!r}"
    if [c["text"] for c in obj["choices"]] != [" hello world"]:
        return f"wrong text: {raw[:200]!r}"
    return None


def _check_stream(model: str, max_tokens: int, raw: bytes) -> tuple[str, str | None]:
    """('stream_ok' | 'stream_error', problem or None)."""
    if not raw.endswith(b"\n\n"):
        return "", f"stream not ended by a blank line: {raw[-120:]!r}"
    events = [e for e in raw.split(b"\n\n") if e]
    if events[-1] != b"data: [DONE]" or raw.count(b"data: [DONE]") != 1:
        return "", f"stream without exactly one final [DONE]: {raw[-120:]!r}"
    objs = [orjson.loads(e[6:]) for e in events[:-1]]
    error = objs[-1] if objs and "error" in objs[-1] else None
    chunks = objs[:-1] if error is not None else objs
    if any("error" in c for c in chunks):
        return "", "error event before the end"
    texts = [c["choices"][0]["text"] for c in chunks]
    if texts != [f" t{i}" for i in range(len(texts))]:
        return "", f"chunks out of order or altered: {texts}"
    if any(c["model"] != model for c in chunks):
        return "", "wrong model name in a chunk"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    # The fake upstream sets finish_reason on its last token only; anything else was invented.
    upstream_finishes = [("length" if i == max_tokens - 1 else None) for i in range(len(chunks))]
    if finishes != upstream_finishes:
        return "", f"finish_reason not the upstream's: {finishes[-3:]} after {len(chunks)}/{max_tokens} chunks"
    if error is not None:
        # A cut after the last token but before [DONE] is still a failed stream: its end was never confirmed.
        if set(error["error"]) != {"message", "type", "param", "code"}:
            return "", f"malformed error event: {error}"
        return "stream_error", None
    if len(texts) != max_tokens:
        return "", f"silently truncated: {len(texts)}/{max_tokens} chunks"
    return "stream_ok", None


async def _one(
    session: aiohttp.ClientSession, url: str, rng: random.Random, hang_after: float
) -> tuple[str, str | None]:
    model = rng.choice(MODELS)
    stream = rng.random() < 0.5
    max_tokens = rng.randint(1, 12)
    payload = {"model": model, "prompt": "soak", "max_tokens": max_tokens, "stream": stream}
    headers = {"x-priority": rng.choice(["interactive", "batch"])}
    abort = rng.random() < 0.05
    timeout = aiohttp.ClientTimeout(total=rng.uniform(0.02, 0.3) if abort and not stream else hang_after)
    try:
        async with session.post(f"{url}/v1/completions", json=payload, headers=headers, timeout=timeout) as resp:
            if abort and stream and resp.status == 200:
                await resp.content.readany()
                resp.close()  # walk away mid-stream
                return "client_abort", None
            raw = await resp.read()
            if resp.status == 200:
                if stream:
                    return _check_stream(model, max_tokens, raw)
                problem = _check_completion(model, raw)
                return "ok", problem
            if resp.status not in CLEAN_ERROR_STATUSES:
                return "", f"status {resp.status}: {raw[:200]!r}"
            error = orjson.loads(raw).get("error")
            if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
                return "", f"status {resp.status} without an error envelope: {raw[:200]!r}"
            if "x-request-id" not in resp.headers:
                return "", "error without x-request-id"
            return f"error_{resp.status}", None
    except TimeoutError:
        if abort:
            return "client_abort", None
        return "", f"hung: no complete answer within {hang_after}s ({'stream' if stream else 'non-stream'})"
    except aiohttp.ClientError as exc:
        return "", f"connection-level failure: {type(exc).__name__}: {exc}"


async def _requests_total(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "gateway_requests_total"
    )


async def _flap(up: FakeUpstream, stop: asyncio.Event, rng: random.Random) -> None:
    """Now and then, refuse connections for a moment (and drop the open ones)."""
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        if stop.is_set():
            break
        await up.go_down()
        await asyncio.sleep(rng.uniform(0.1, 0.4))
        await up.come_up()


async def _eventually_equal(read: Any, expected: float, within: float) -> float:
    deadline = time.monotonic() + within
    value = await read()
    while value != expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        value = await read()
    return float(value)


async def _settle(check: Any, within: float) -> bool:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def run_soak(
    requests: int = 5000,
    concurrency: int = 64,
    seed: int = 1,
    max_seconds: float = 300.0,
    hang_after: float = 15.0,
    max_rss_growth_mb: float = 40.0,
) -> SoakReport:
    rng = random.Random(seed)
    report = SoakReport()
    ups = [FakeUpstream() for _ in range(3)]
    for up in ups:
        await up.start()
    text = CONFIG.format(
        up0=ups[0].url, up1=ups[1].url, up2=ups[2].url, timeout=TIMEOUT, max_in_flight=max(8, concurrency // 2)
    )
    app = create_app(parse_config(text, "<soak>", env={}))
    state = app[STATE]
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    stop = asyncio.Event()
    flapper: asyncio.Task[None] | None = None
    try:
        # Warm-up without faults: fills keep-alive pools, imports, caches; then the baselines.
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            await asyncio.gather(*(
                session.post(f"{url}/v1/completions", json={"model": m, "prompt": "w", "max_tokens": 2})
                for m in MODELS for _ in range(max(1, concurrency // len(MODELS)))
            ))  # fmt: skip
        warm_requests = len(MODELS) * max(1, concurrency // len(MODELS))
        gc.collect()
        base_rss, base_fds, base_tasks = _rss_mb(), _fds(), len(asyncio.all_tasks())
        base_conns = sum(up.open_connections for up in ups)

        for up in ups:
            up.default = chaos(random.Random(rng.random()))
        flapper = asyncio.create_task(_flap(ups[2], stop, random.Random(rng.random())))
        started = time.monotonic()
        queue: asyncio.Queue[None] = asyncio.Queue()
        for _ in range(requests):
            queue.put_nowait(None)

        async def worker(session: aiohttp.ClientSession, wrng: random.Random) -> None:
            while not queue.empty() and time.monotonic() - started < max_seconds:
                queue.get_nowait()
                report.sent += 1
                if report.sent % 256 == 0:
                    for up in ups:
                        up.requests.clear()  # the fakes' memory of requests is not the gateway's
                outcome, problem = await _one(session, url, wrng, hang_after)
                if problem is not None:
                    report.failures.append(problem)
                    outcome = "FAILED"
                report.outcomes[outcome] += 1

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            await asyncio.gather(*(worker(session, random.Random(rng.random())) for _ in range(concurrency)))
            report.seconds = time.monotonic() - started
            stop.set()
            await flapper
            flapper = None
            for up in ups:
                up.default = None
            # Every request, aborted ones included, is accounted for exactly once.
            expected = report.sent + warm_requests
            counted = await _eventually_equal(lambda: _requests_total(session, url), expected, within=10)
            if counted != expected:
                report.failures.append(f"gateway_requests_total is {counted:.0f}, expected {expected}")

        # Quiescence: nothing in flight anywhere, nothing held.
        limiters = [state.admission.limiter, *(r.guard.limiter for e in state.router.models.values() for r in e.routes)]
        if not await _settle(
            lambda: (
                all(up.active == 0 and up.open_streams == 0 for up in ups)
                and all(lim.active == 0 and lim.waiting == 0 for lim in limiters)
                and len(state.in_flight) == 0
            ),
            within=10,
        ):
            report.failures.append(
                "not quiescent: upstream active "
                f"{[up.active for up in ups]}, streams {[up.open_streams for up in ups]}, limiters "
                f"{[(lim.name, lim.active, lim.waiting) for lim in limiters]}, in flight {len(state.in_flight)}"
            )
        # Connections: at most the warm-up's idle pool per upstream; broken ones were closed.
        if not await _settle(lambda: sum(up.open_connections for up in ups) <= max(base_conns, 1) + 3, within=10):
            report.failures.append(
                f"upstream connections {[up.open_connections for up in ups]} above the warm-up's {base_conns}"
            )
        await _settle(lambda: len(asyncio.all_tasks()) <= base_tasks + 2, within=10)
        gc.collect()
        tasks, fds = len(asyncio.all_tasks()), _fds()
        report.rss_growth_mb = _rss_mb() - base_rss
        report.details.update(
            tasks=f"{tasks} (after warm-up {base_tasks})",
            fds=f"{fds} (after warm-up {base_fds})",
            upstream_connections=f"{sum(up.open_connections for up in ups)} (after warm-up {base_conns})",
            upstream_requests=sum(len(up.requests) for up in ups),
        )
        if tasks > base_tasks + 2:
            report.failures.append(f"tasks leaked: {tasks} > {base_tasks} + 2")
        if base_fds >= 0 and fds > base_fds + 8:
            report.failures.append(f"file descriptors leaked: {fds} > {base_fds} + 8")
        if report.rss_growth_mb > max_rss_growth_mb:
            report.failures.append(f"RSS grew {report.rss_growth_mb:.1f} MB > {max_rss_growth_mb} MB")
    finally:
        stop.set()
        if flapper is not None:
            flapper.cancel()
            await asyncio.gather(flapper, return_exceptions=True)
        await runner.cleanup()
        for up in ups:
            await up.stop()
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-seconds", type=float, default=300.0, help="stop sending new requests after this")
    parser.add_argument("--hang-after", type=float, default=15.0, help="a request unanswered this long is a hang")
    parser.add_argument("--max-rss-growth-mb", type=float, default=40.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # The fake upstreams' own server logs every connection the chaos breaks on purpose.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    report = asyncio.run(
        run_soak(args.requests, args.concurrency, args.seed, args.max_seconds, args.hang_after, args.max_rss_growth_mb)
    )
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
