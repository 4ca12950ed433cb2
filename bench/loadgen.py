"""Closed-loop HTTP/1.1 load generator for POST /v1/completions or /v1/chat/completions (loopback only).

``-c`` keep-alive connections each send one pre-encoded request, read the whole
response (Content-Length or chunked), and send the next, for ``--warmup`` +
``--duration`` seconds; only responses that finish inside the measured window
count. Streams record time to the first ``data:`` event (TTFT) and must end with
``data: [DONE]`` (a Responses stream, ``--responses``: with ``response.completed``).
``--chat`` sends a chat body (the prompt as one user message, the
same ``max_tokens``) to a ``/v1/chat/completions`` URL. Raw asyncio Protocol on uvloop, minimal parsing, so one core
drives well over 10k req/s. Prints one JSON line.

  python bench/loadgen.py --url http://127.0.0.1:18001/v1/completions -c 64 -d 10 --stream --max-tokens 64
  python bench/loadgen.py --url http://127.0.0.1:18001/v1/chat/completions --chat -c 64 -d 10
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import math
import multiprocessing
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import orjson

_DONE = b"data: [DONE]"


class Run:
    """Shared state of one load-generator process."""

    def __init__(self, args: argparse.Namespace, concurrency: int, start_wall: float) -> None:
        u = urlsplit(args.url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        body: dict[str, Any] = {
            "model": args.model,
            "prompt": args.prompt,
            "max_tokens": args.max_tokens,
            "temperature": 0,
        }
        if args.responses:  # same words, same limit, as a Responses request
            body = {
                "model": args.model,
                "input": args.prompt,
                "max_output_tokens": args.max_tokens,
                "temperature": 0,
            }
        if args.embed:  # an embeddings request: --embed inputs of the prompt's words, floats back
            text = " ".join(["word"] * args.embed_tokens)
            body = {"model": args.model, "input": text if args.embed == 1 else [text] * args.embed}
            body["encoding_format"] = "float"
        elif args.chat:  # same words, same limit: the two endpoints differ only in their shapes
            body = {
                "model": args.model,
                "messages": [{"role": "user", "content": args.prompt}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
            }
        if args.stream:
            body["stream"] = True
            if args.include_usage and not args.responses:
                body["stream_options"] = {"include_usage": True}
        data = orjson.dumps(body)
        auth = f"Authorization: Bearer {args.auth}\r\n" if args.auth else ""
        accept = "text/event-stream" if args.stream else "application/json"
        self.request = (
            f"POST {u.path or '/'} HTTP/1.1\r\nHost: {u.netloc}\r\nContent-Type: application/json\r\n"
            f"Accept: {accept}\r\n{auth}Content-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        self.stream = bool(args.stream)
        self.concurrency = concurrency
        self.timeout = args.timeout
        self.ramp = args.ramp
        t0 = time.perf_counter() + max(0.0, start_wall - time.time())
        self.started = t0
        self.warm_at = t0 + args.warmup
        self.end_at = self.warm_at + args.duration
        self.lat: list[float] = []
        self.ttft: list[float] = []
        self.counts = {"ok": 0, "errors": 0, "non200": 0, "incomplete": 0, "events": 0, "connects": 0}
        self.first_error = ""
        self.active = 0
        self.conns: set[Conn] = set()
        self.finished = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()

    def reconnect(self, delay: float = 0.0) -> None:
        task = asyncio.ensure_future(self.connect(delay))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def error(self, kind: str, message: str, at: float) -> None:
        if self.warm_at <= at <= self.end_at:
            self.counts[kind] += 1
        if not self.first_error:
            self.first_error = message

    async def connect(self, delay: float = 0.0) -> None:
        if delay:
            await asyncio.sleep(delay)
        loop = asyncio.get_running_loop()
        while time.perf_counter() < self.end_at:
            try:
                await loop.create_connection(lambda: Conn(self), self.host, self.port)
                self.counts["connects"] += 1
                return
            except OSError as exc:
                self.error("errors", f"connect: {exc}", time.perf_counter())
                await asyncio.sleep(0.05)
        self.retire()

    def retire(self) -> None:
        self.active -= 1
        if self.active <= 0:
            self.finished.set()

    async def main(self) -> None:
        self.active = self.concurrency
        await asyncio.sleep(max(0.0, self.started - time.perf_counter()))
        for i in range(self.concurrency):
            self.reconnect(self.ramp * i / self.concurrency)
        while not self.finished.is_set():  # watchdog: per-request timeout and a hard stop
            try:
                await asyncio.wait_for(self.finished.wait(), 0.25)
            except TimeoutError:
                pass
            now = time.perf_counter()
            for conn in list(self.conns):
                if conn.t0 and now - conn.t0 > self.timeout:
                    self.error("errors", "timeout", now)
                    conn.t0 = 0.0
                    conn.abort()
            if now > self.end_at + self.timeout + 5:
                break
        for conn in list(self.conns):
            conn.abort()
        for task in list(self.tasks):
            task.cancel()


class Conn(asyncio.Protocol):
    """One keep-alive connection running requests back to back."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.tr: asyncio.Transport | None = None
        self.t0 = 0.0  # request start; 0 = idle
        self.reset()
        self.live = True  # still counted in run.active

    def reset(self) -> None:
        self.head = b""
        self.body = bytearray()
        self.status = 0
        self.length = -1  # Content-Length; -1 = chunked
        self.close_after = False
        self.pos = 0  # chunked scanner: next unread offset in body
        self.need = 0  # bytes left of the current chunk (+ its CRLF)
        self.first = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr = transport  # type: ignore[assignment]
        self.run.conns.add(self)
        self.send()

    def send(self) -> None:
        assert self.tr is not None
        self.reset()
        self.t0 = time.perf_counter()
        self.tr.write(self.run.request)

    def abort(self) -> None:
        if self.tr is not None:
            self.tr.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        run = self.run
        run.conns.discard(self)
        now = time.perf_counter()
        if self.t0:
            self.t0 = 0.0
            run.error("errors", f"connection lost mid-response: {exc}", now)
        if not self.live:  # this slot already moved on (finished, or reconnecting)
            return
        self.live = False
        if now < run.end_at:
            run.reconnect()
        else:
            run.retire()

    def data_received(self, data: bytes) -> None:
        if not self.status:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.head[:end].lower()
            data = self.head[end + 4 :]
            if not head.startswith(b"http/1.") or not head[9:12].isdigit():
                self.run.error("errors", f"bad response head: {head[:100]!r}", time.perf_counter())
                self.abort()
                return
            self.status = int(head[9:12])
            self.close_after = b"\r\nconnection: close" in head
            if b"chunked" not in _header(head, b"\r\ntransfer-encoding:"):
                self.length = int(_header(head, b"\r\ncontent-length:") or 0)
        if self.run.stream and not self.first and b"data:" in data:
            self.first = time.perf_counter()
        body = self.body
        body += data
        if self.length >= 0:
            if len(body) >= self.length:
                self.complete()
            return
        n = len(body)  # chunked: skip over chunk data by offsets, parse only the size lines
        while self.pos < n:
            if self.need:
                step = min(self.need, n - self.pos)
                self.pos += step
                self.need -= step
                continue
            eol = body.find(b"\r\n", self.pos)
            if eol < 0:
                return
            size = int(body[self.pos : eol].split(b";", 1)[0], 16)
            if size == 0:
                if body.endswith(b"\r\n\r\n") and len(body) >= eol + 4:
                    self.complete()
                return
            self.need = size + 2
            self.pos = eol + 2

    def complete(self) -> None:
        run = self.run
        now = time.perf_counter()
        t0, self.t0 = self.t0, 0.0
        in_window = run.warm_at <= now <= run.end_at
        if self.status != 200:
            run.error("non200", f"HTTP {self.status}: {bytes(self.body[:200])!r}", now)
        elif run.stream and not _stream_done(self.body, self.length < 0):
            run.error("incomplete", f"stream without data: [DONE]: {bytes(self.body[-200:])!r}", now)
        elif in_window:
            run.counts["ok"] += 1
            run.lat.append((now - t0) * 1000.0)
            if run.stream:
                run.ttft.append((self.first - t0) * 1000.0)
                run.counts["events"] += self.body.count(b"data:") - 1
        assert self.tr is not None
        if now >= run.end_at:
            self.live = False
            run.retire()
            self.tr.close()
        elif self.close_after:
            self.live = False
            self.tr.close()
            run.reconnect()
        else:
            self.send()


def _header(head: bytes, name: bytes) -> bytes:
    """The value of header ``name`` (lower-case, with leading CRLF and colon) in a lower-cased head."""
    i = head.find(name)
    if i < 0:
        return b""
    j = head.find(b"\r\n", i + 2)
    return head[i + len(name) : j if j > 0 else len(head)].strip()


def _stream_done(body: bytearray, chunked: bool) -> bool:
    if _DONE in body[-64:]:
        return True
    # A Responses stream ends with its terminal event (the whole response: look further back).
    tail = bytes(body[-16384:])
    if b"event: response.completed" in tail or b"event: response.incomplete" in tail:
        return b"event: response.failed" not in tail
    if not chunked:
        return bytes(body).rstrip().endswith(_DONE)
    out, pos = bytearray(), 0  # [DONE] split across chunks: decode the whole body
    while (eol := body.find(b"\r\n", pos)) >= 0 and (size := int(body[pos:eol].split(b";")[0], 16)):
        out += body[eol + 2 : eol + 2 + size]
        pos = eol + 4 + size
    return bytes(out).rstrip().endswith(_DONE)


def _pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values), max(1, math.ceil(p / 100 * len(values)))) - 1], 3)


def _worker(job: tuple[argparse.Namespace, int, float]) -> dict[str, Any]:
    args, concurrency, start_wall = job

    async def go() -> Run:
        run = Run(args, concurrency, start_wall)
        await run.main()
        return run

    try:
        import uvloop
    except ImportError:  # pragma: no cover
        run = asyncio.run(go())
    else:
        run = uvloop.run(go())
    return {"lat": run.lat, "ttft": run.ttft, "counts": run.counts, "first_error": run.first_error}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    procs = max(1, min(args.procs, args.concurrency))
    start = time.time() + (0.3 if procs > 1 else 0.0)
    shares = [args.concurrency // procs + (i < args.concurrency % procs) for i in range(procs)]
    jobs = [(args, share, start) for share in shares]
    if procs == 1:
        parts = [_worker(jobs[0])]
    else:
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            parts = pool.map(_worker, jobs)
    lat = sorted(x for p in parts for x in p["lat"])
    ttft = sorted(x for p in parts for x in p["ttft"])
    counts = {k: sum(p["counts"][k] for p in parts) for k in parts[0]["counts"]}
    ok = counts["ok"]
    out: dict[str, Any] = {
        "rps": round(ok / args.duration, 1),
        "p50_ms": _pct(lat, 50),
        "p90_ms": _pct(lat, 90),
        "p99_ms": _pct(lat, 99),
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "errors": counts["errors"] + counts["non200"] + counts["incomplete"],
        "requests": ok,
        "mean_ms": round(sum(lat) / ok, 3) if ok else None,
        "rps_little": round(args.concurrency / (sum(lat) / ok / 1000.0), 1) if ok else 0.0,
        "per_conn": round(ok / args.concurrency, 1),
        "concurrency": args.concurrency,
        "stream": args.stream,
        "detail": {k: v for k, v in counts.items() if k != "ok"},
        "first_error": next((p["first_error"] for p in parts if p["first_error"]), ""),
    }
    if args.stream:
        out["events_per_stream"] = round(counts["events"] / ok, 2) if ok else 0.0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="http://127.0.0.1:PORT/v1/completions (or /v1/chat/completions)")
    ap.add_argument("--chat", action="store_true", help="send a chat body (messages) instead of a prompt")
    ap.add_argument("--embed", type=int, default=0, help="send an embeddings body of this many inputs")
    ap.add_argument("--embed-tokens", type=int, default=64, help="words per embeddings input")
    ap.add_argument("--responses", action="store_true", help="send a Responses body (input) to /v1/responses")
    ap.add_argument("-c", "--concurrency", type=int, default=1)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("-w", "--warmup", type=float, default=2.0)
    ap.add_argument("--ramp", type=float, default=None, help="spread connection starts (default warmup/2)")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--include-usage", action="store_true", help="ask for a usage chunk on streams")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="bench")
    ap.add_argument("--prompt", default="Say something about benchmarks please")
    ap.add_argument("--auth", default="", help="bearer token")
    ap.add_argument("--timeout", type=float, default=60.0, help="per request, seconds")
    ap.add_argument("--procs", type=int, default=1, help="client processes sharing -c")
    args = ap.parse_args()
    if args.ramp is None:
        args.ramp = args.warmup / 2
    u = urlsplit(args.url)
    if u.scheme != "http" or not ipaddress.ip_address(u.hostname or "").is_loopback:
        sys.exit("loadgen: http:// to a loopback IP only")
    if not (0 < args.concurrency <= 20_000 and args.duration > 0 and args.warmup >= 0):
        sys.exit("loadgen: bad bounds")
    print(orjson.dumps(measure(args)).decode(), flush=True)


if __name__ == "__main__":
    main()
