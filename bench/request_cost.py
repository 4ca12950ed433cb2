"""Deterministic per-request cost of the gateway: Python calls per request, and CPU per request.

    .venv/bin/python bench/request_cost.py                          # this checkout
    .venv/bin/python bench/request_cost.py --ref /work/wt/baseline  # and another one, side by side
    .venv/bin/python bench/request_cost.py --scenarios ns,chat_ns --top 30 --dump /tmp/prof
    .venv/bin/python bench/request_cost.py --trace 0,1,100     # and this checkout with tracing on (sampled %)
    .venv/bin/python bench/request_cost.py --pricing           # and this checkout with models[].pricing set
    .venv/bin/python bench/request_cost.py --auth --pricing    # every target with one key; priced's has a budget

Starts the fast fake upstream (bench/fake_upstream.py) and one ``gateway serve`` per
checkout (each with that checkout's ``.venv/bin/python``, a ``type: openai`` backend (``--backend-type vllm``:
the vLLM adapter, whose Responses go through the chat bridge), the
config bench/run.py uses), then per scenario drives ``-n`` requests over ``-c`` keep-alive
connections from this process:

- calls per request: the gateway process turns cProfile on (SIGUSR1) for exactly those
  requests and off (SIGUSR2), so start-up and warm-up are not counted. The count is
  every Python and builtin call the gateway made, divided by the requests: it does not
  move with the machine's load, so two checkouts compare on a busy machine.
- CPU per request: the gateway's own run time (``/proc/<pid>/task/*/schedstat``, ns)
  over ``-n`` unprofiled requests, the median of ``--repeats`` rounds; the checkouts
  take turns within each round (A/B interleaved), so a load spike hits both. With ``--ref``
  the median of the per-round ratios against each other column is printed too (each round's pair ran back to back).

Scenarios: ``ns`` (completions, 16 tokens), ``st`` (completions stream, 64 tokens),
``chat_ns``, ``chat_st`` (the same words as one user message), ``resp_ns``, ``resp_st`` (the same
words as a Responses ``input``, the same limit as ``max_output_tokens``; the fake upstream answers
on its own ``/v1/responses``, OpenAI's events: the ``openai`` backend relays them), ``emb``
(embeddings: one 64-word input, a 1,024-dim float vector back, as bench/run.py's ``emb_c64``).
``--auth``: every target has ``auth:`` with one key (no store: in memory) and every request carries
it; with ``--pricing`` the ``priced`` target's key also has a budget (``auth.keys[].budget``, never
reached), so ``this`` against ``priced`` is what prices and a budget add to the same keyed request.
``resp_prev20`` (``resp_ns`` continuing a conversation of 20 stored turns with
``previous_response_id``: the store's read, the earlier turns' items sent again, the new turn
stored; compare with ``resp_ns`` of the same run); ``resp_ns_nostore``, ``resp_st_nostore`` (``resp_ns``,
``resp_st`` with ``"store": false``: the turn is not saved; against ``resp_ns``/``resp_st`` of the same run,
what the conversation store's save costs). ``chat_tools``, ``resp_tools``: an agent's turn, as
the Codex CLI sends it (``agent_request``: the recorded Codex 0.171 request, ~40 KB, its seven
function tools and a ``namespace`` of five, developer and user messages, ``parallel_tool_calls``,
``reasoning: {"summary": "auto"}``, ``include: ["reasoning.encrypted_content"]``,
``prompt_cache_key``, ``client_metadata``, ``store: false``), its first developer message as
``instructions``; not streamed (Codex streams: here the request side alone, the answer a 16-token
message); without its built-in ``web_search`` (a self-hosted backend refuses it unless the
operator omits it) and its ``tool_choice: "auto"`` (the default with tools; the bench's ``vllm``
backend has no ``tool_parser:`` and refuses it by name). ``chat_tools`` is the chat request that
means the same (the bridge's translation: a system message, the tools flattened
``<namespace>__<name>``, ``max_completion_tokens``). A checkout that does not serve an endpoint
(404) shows ``n/a`` for it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SCENARIOS = {  # name: (path, chat (or "responses"), stream, max_tokens)
    "ns": ("/v1/completions", False, False, 16),
    "st": ("/v1/completions", False, True, 64),
    "chat_ns": ("/v1/chat/completions", True, False, 16),
    "chat_st": ("/v1/chat/completions", True, True, 64),
    "resp_ns": ("/v1/responses", "responses", False, 16),
    "resp_st": ("/v1/responses", "responses", True, 64),
    "emb": ("/v1/embeddings", False, False, 64),  # one 64-word input; the answer: one 1,024-dim float vector
    # resp_ns continuing a stored conversation of PREVIOUS_TURNS turns (previous_response_id; memory store)
    "resp_prev20": ("/v1/responses", "responses", False, 16),
    # resp_ns and resp_st with ``"store": false``: the same turn, not kept (what the store's save costs)
    "resp_ns_nostore": ("/v1/responses", "responses", False, 16),
    "resp_st_nostore": ("/v1/responses", "responses", True, 64),
    # an agent's turn (Codex's tools and messages, agent_request below): as chat, and as Responses
    "chat_tools": ("/v1/chat/completions", True, False, 16),
    "resp_tools": ("/v1/responses", "responses", False, 16),
}
PREVIOUS_TURNS = 20
PREVIOUS: dict[int, str] = {}  # gateway port -> the last response of its conversation (resp_prev20)
PROMPT = "Say something about benchmarks please"
CODEX_TURN = ROOT / "tests" / "fixtures" / "responses" / "codex-0.171-turn1.json"  # a recorded Codex request


def agent_request(chat: bool, tokens: int) -> dict[str, Any]:
    """``resp_tools``/``chat_tools``: the recorded Codex turn (tests/fixtures/responses/codex-0.171-turn1.json)
    with its first developer message as ``instructions``, not streamed; as Responses, or as the chat
    request that means the same (what backends/responses/to_chat.py makes of it)."""
    import json

    body = json.loads(CODEX_TURN.read_text())["body"]
    first, *items = body["input"]
    instructions = "".join(part["text"] for part in first["content"])
    # Left out: web_search (a built-in tool, refused on a self-hosted backend unless the operator omits
    # it) and tool_choice "auto" (the default with tools; the bench's vllm backend has no tool_parser:
    # and refuses it by name)
    tools = [tool for tool in body["tools"] if tool["type"] in ("function", "namespace")]
    if not chat:
        keep = ("parallel_tool_calls", "reasoning", "store", "include", "prompt_cache_key")
        return {
            "model": "bench", "instructions": instructions, "input": items, "tools": tools,
            **{key: body[key] for key in keep}, "client_metadata": body["client_metadata"], "max_output_tokens": tokens,
        }  # fmt: skip

    def function(tool: dict[str, Any], name: str) -> dict[str, Any]:
        spec = {"name": name, "description": tool["description"], "parameters": tool["parameters"]}
        return {"type": "function", "function": {**spec, **({"strict": tool["strict"]} if "strict" in tool else {})}}

    chat_tools = []
    for tool in tools:
        if tool["type"] == "namespace":  # flattened as the bridge does: <namespace>__<name>
            chat_tools += [function(inner, f"{tool['name']}__{inner['name']}") for inner in tool["tools"]]
        else:
            chat_tools.append(function(tool, tool["name"]))
    messages = [{"role": "system", "content": instructions}]
    for item in items:
        parts = [{"type": "text", "text": part["text"]} for part in item["content"]]
        messages.append({"role": item["role"], "content": parts})
    return {
        "model": "bench", "messages": messages, "tools": chat_tools,
        "parallel_tool_calls": body["parallel_tool_calls"], "max_completion_tokens": tokens,
    }  # fmt: skip


# --- inside the gateway process ------------------------------------------------------------------


def serve_profiled(config: str, port: int, out: str) -> None:
    """``gateway serve`` with cProfile switched on by SIGUSR1 and off (then dumped) by SIGUSR2."""
    import cProfile

    sys.path.insert(0, os.getcwd())
    import gc

    prof = cProfile.Profile()
    gc_time = [0.0, 0.0, 0, 0]  # seconds in the collector, start of the current one, collections, full ones

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_time[1] = time.perf_counter()
        else:
            gc_time[0] += time.perf_counter() - gc_time[1]
            gc_time[2] += 1
            gc_time[3] += info["generation"] == 2

    gc.callbacks.append(on_gc)

    def on(*_: Any) -> None:
        gc_time[0], gc_time[2], gc_time[3] = 0.0, 0, 0
        prof.enable()
        Path(out + ".on").touch()

    def off(*_: Any) -> None:
        prof.disable()
        prof.dump_stats(out)
        prof.clear()
        Path(out + ".gc").write_text(f"{gc_time[0]} {gc_time[2]} {gc_time[3]} {len(gc.get_objects())}")
        Path(out + ".done").touch()

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    from gateway.cli import main

    sys.exit(main(["serve", "--config", config, "--port", str(port), "--log-level", "WARNING"]))


# --- the driver ----------------------------------------------------------------------------------


AUTH_KEY = "sk-bench-key-0123456789"
AUTH_HEADER = ""  # --auth: "Authorization: Bearer <AUTH_KEY>\r\n" on every request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"process {proc.args} exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"nothing listening on {port} after {timeout}s")


def request_bytes(scenario: str, port: int) -> bytes:
    path, chat, stream, tokens = SCENARIOS[scenario]
    body: dict[str, Any] = {"model": "bench", "max_tokens": tokens, "temperature": 0}
    if scenario.endswith("_tools"):
        body = agent_request(chat is True, tokens)
    elif chat == "responses":
        body = {"model": "bench", "input": PROMPT, "max_output_tokens": tokens, "temperature": 0}
        if scenario == "resp_prev20":
            body["previous_response_id"] = PREVIOUS[port]
        elif scenario.endswith("_nostore"):
            body["store"] = False
    elif path == "/v1/embeddings":
        body = {"model": "bench", "input": " ".join(f"word{i}" for i in range(tokens))}
    elif chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if stream:
        body["stream"] = True
    import json

    data = json.dumps(body, separators=(",", ":")).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"{AUTH_HEADER}Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                return status, bytes(body)
            body += await reader.readexactly(size + 2)
    length = int(lower.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
    return status, await reader.readexactly(length)


async def drive(port: int, scenario: str, n: int, concurrency: int) -> tuple[int, int]:
    """Send ``n`` requests over ``concurrency`` connections: (ok answers, the first other status)."""
    request = request_bytes(scenario, port)
    stream = SCENARIOS[scenario][2]
    ok, bad = 0, 0

    async def one_connection(count: int) -> None:
        nonlocal ok, bad
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for _ in range(count):
                writer.write(request)
                status, body = await read_response(reader)
                if status == 200 and (
                    not stream
                    or b"data: [DONE]" in body
                    or b"event: response.completed" in body
                    or b"event: response.incomplete" in body
                ):
                    ok += 1
                elif not bad:
                    bad = status
        finally:
            writer.close()

    share = [n // concurrency + (i < n % concurrency) for i in range(concurrency)]
    await asyncio.gather(*(one_connection(k) for k in share if k))
    return ok, bad


async def conversation(port: int, turns: int) -> str:
    """Store a conversation of ``turns`` chained Responses on the gateway at ``port``; its last id."""
    import json

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    previous: str | None = None
    try:
        for i in range(turns):
            body: dict[str, Any] = {"model": "bench", "input": f"{PROMPT} ({i})", "max_output_tokens": 16}
            if previous is not None:
                body["previous_response_id"] = previous
            data = json.dumps(body).encode()
            writer.write(
                f"POST /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            status, answer = await read_response(reader)
            if status != 200:
                sys.exit(f"building the conversation: turn {i} answered {status}: {answer[:300]!r}")
            previous = str(json.loads(answer)["id"])
    finally:
        writer.close()
    assert previous is not None
    return previous


def run_ns(pid: int) -> int:
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except (OSError, ValueError):
            pass
    return total


class Target:
    def __init__(
        self,
        name: str,
        checkout: Path,
        upstream: int,
        work: Path,
        kind: str = "openai",
        trace_pct: float | None = None,
        pricing: bool = False,
        auth: bool = False,
        endpoints: str = "completions, chat, responses, embeddings",
    ) -> None:
        self.name, self.checkout = name, checkout
        self.port = free_port()
        self.prof = str(work / f"{name}.prof")
        config = work / f"{name}.yaml"
        # --trace PCT: tracing on, PCT % sampled, exported over OTLP/HTTP to the fake upstream, which drops it.
        telemetry = (
            f"telemetry: {{otlp_endpoint: 'http://127.0.0.1:{upstream}', sample_ratio: {trace_pct / 100:g}}}\n"
            if trace_pct is not None
            else ""
        )
        budget = ", budget: {amount: 1000000, period: month}" if pricing else ""
        keys = f"auth: {{keys: [{{name: bench, key: {AUTH_KEY}{budget}}}]}}\n" if auth else ""
        config.write_text(f"""server: {{host: 127.0.0.1, port: {self.port}, drain_timeout: 1}}
{telemetry}{keys}backends:
  - {{name: upstream, type: {kind}, base_url: "http://127.0.0.1:{upstream}/v1", api_key: sk-bench}}
models:
  - name: bench
{"    pricing: {input: 0.15, output: 0.6, cached_input: 0.075}" + chr(10) if pricing else ""}    routes:
      - {{backend: upstream, model: bench}}
    endpoints: [{endpoints}]
""")
        python = checkout / ".venv" / "bin" / "python"
        argv = [str(python), str(Path(__file__).resolve()), "--serve-profiled", str(config), str(self.port), self.prof]
        self.log = open(work / f"{name}.log", "ab")  # closed in stop()
        self.proc = subprocess.Popen(
            argv,
            cwd=checkout,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(checkout)},
        )
        wait_port(self.port, self.proc)

    def signal_and_wait(self, sig: int, marker: str) -> None:
        Path(marker).unlink(missing_ok=True)
        os.kill(self.proc.pid, sig)
        deadline = time.monotonic() + 30
        while not Path(marker).exists():
            if time.monotonic() > deadline:
                sys.exit(f"{self.name}: no answer to signal {sig}")
            # the handler runs when the loop wakes: a health request wakes it
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            except OSError:
                pass
            time.sleep(0.02)

    def profile(self, scenario: str, n: int, concurrency: int) -> pstats.Stats | None:
        self.signal_and_wait(signal.SIGUSR1, self.prof + ".on")
        ok, bad = asyncio.run(drive(self.port, scenario, n, concurrency))
        self.signal_and_wait(signal.SIGUSR2, self.prof + ".done")
        if ok != n:
            print(f"  {self.name} {scenario}: {n - ok} of {n} failed (status {bad})", file=sys.stderr)
            return None
        seconds, collections, full, objects = Path(self.prof + ".gc").read_text().split()
        print(
            f"  {self.name} {scenario}: GC {float(seconds) / n * 1e6:.1f} us/req, {collections} collections"
            f" ({full} full), {objects} tracked objects",
            file=sys.stderr,
        )
        return pstats.Stats(self.prof)

    def cpu_us(self, scenario: str, n: int, concurrency: int) -> float | None:
        before = run_ns(self.proc.pid)
        ok, _ = asyncio.run(drive(self.port, scenario, n, concurrency))
        return (run_ns(self.proc.pid) - before) / n / 1e3 if ok == n else None

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def label(func: tuple[str, int, str]) -> str:
    path, line, name = func
    if path == "~":
        return name
    for root in (str(ROOT), os.getcwd()):
        path = path.replace(root + "/", "")
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    return f"{path}:{line}({name})"


def summary(stats: pstats.Stats, n: int, top: int) -> tuple[float, list[str]]:
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(nc for (_, nc, _, _, _) in raw.values())
    by_cum = sorted(raw.items(), key=lambda kv: kv[1][3], reverse=True)[:top]
    by_calls = sorted(raw.items(), key=lambda kv: kv[1][1], reverse=True)[:top]
    lines = [f"    {'cum us/req':>10} {'calls/req':>9}  function (by cumulative time)"]
    lines += [f"    {ct / n * 1e6:10.1f} {nc / n:9.2f}  {label(f)}" for f, (_, nc, _, ct, _) in by_cum]
    lines += [f"    {'':>10} {'calls/req':>9}  function (by calls)"]
    lines += [f"    {'':>10} {nc / n:9.2f}  {label(f)}" for f, (_, nc, _, _, _) in by_calls]
    return total / n, lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, action="append", default=[], help="another checkout (with .venv)")
    ap.add_argument("-n", type=int, default=2000, help="requests per measurement")
    ap.add_argument("-c", type=int, default=16, help="keep-alive connections")
    ap.add_argument("--repeats", type=int, default=5, help="CPU rounds (median); 0: calls only")
    ap.add_argument("--warmup", type=int, default=300, help="requests before measuring, per scenario")
    ap.add_argument("--scenarios", default="ns,st,chat_ns,chat_st,resp_ns,resp_st")
    ap.add_argument(
        "--trace",
        default="",
        help="also this checkout with tracing on at these sampled percentages, e.g. 0,1,100 (columns trace<PCT>)",
    )
    ap.add_argument(
        "--pricing", action="store_true", help="also this checkout with models[].pricing set (column priced)"
    )
    ap.add_argument(
        "--auth",
        action="store_true",
        help="every target with auth: one key on every request (with --pricing, priced's key has a budget)",
    )
    ap.add_argument("--top", type=int, default=0, help="print the top N functions per cell")
    ap.add_argument(
        "--backend-type",
        default="openai",
        choices=("openai", "vllm"),
        help="the backend's type: openai relays Responses natively, vllm serves it through its chat dialect",
    )
    ap.add_argument("--dump", type=Path, help="keep each cell's cProfile stats in this folder")
    ap.add_argument("--serve-profiled", nargs=3, metavar=("CONFIG", "PORT", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_profiled:
        config, port, out = args.serve_profiled
        serve_profiled(config, int(port), out)
        return
    scenarios = args.scenarios.split(",")
    for s in scenarios:
        if s not in SCENARIOS:
            sys.exit(f"unknown scenario {s!r}: {', '.join(SCENARIOS)}")
    with tempfile.TemporaryDirectory(prefix="request-cost-") as tmp:
        work = Path(tmp)
        upstream_port = free_port()
        upstream = subprocess.Popen(
            [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(upstream_port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        targets: list[Target] = []
        try:
            wait_port(upstream_port, upstream)
            checkouts = [("this", ROOT)] + [
                (f"ref{i}" if len(args.ref) > 1 else "ref", p.resolve()) for i, p in enumerate(args.ref)
            ]
            if args.auth:
                global AUTH_HEADER
                AUTH_HEADER = f"Authorization: Bearer {AUTH_KEY}\r\n"
            # Only the endpoints the scenarios use, so a checkout from before Responses or embeddings starts.
            endpoints = ", ".join(
                e
                for e, used in (
                    ("completions", True),
                    ("chat", True),
                    ("responses", any(s.startswith("resp") for s in scenarios)),
                    ("embeddings", "emb" in scenarios),
                )
                if used
            )
            targets = [
                Target(name, path, upstream_port, work, args.backend_type, auth=args.auth, endpoints=endpoints)
                for name, path in checkouts
            ]
            targets += [
                Target(
                    f"trace{pct}",
                    ROOT,
                    upstream_port,
                    work,
                    args.backend_type,
                    float(pct),
                    auth=args.auth,
                    endpoints=endpoints,
                )
                for pct in args.trace.split(",")
                if pct
            ]
            if args.pricing:
                targets.append(
                    Target(
                        "priced",
                        ROOT,
                        upstream_port,
                        work,
                        args.backend_type,
                        pricing=True,
                        auth=args.auth,
                        endpoints=endpoints,
                    )
                )
            results: dict[tuple[str, str], dict[str, Any]] = {}
            for s in scenarios:
                for t in targets:
                    results[(t.name, s)] = cell = {"calls": None, "lines": [], "cpu": [], "rounds": {}}
                    if s == "resp_prev20":
                        PREVIOUS[t.port] = asyncio.run(conversation(t.port, PREVIOUS_TURNS))
                    ok, _ = asyncio.run(drive(t.port, s, args.warmup, args.c))
                    stats = t.profile(s, args.n, args.c) if ok == args.warmup else None
                    if stats is None:
                        continue
                    if args.dump:
                        args.dump.mkdir(parents=True, exist_ok=True)
                        stats.dump_stats(str(args.dump / f"{t.name}-{s}.prof"))
                    cell["calls"], cell["lines"] = summary(stats, args.n, args.top)
            # Every cell takes its turn in every round (checkouts in alternating order), so
            # a load spike from elsewhere lands on all of them, not on one scenario's rounds.
            for r in range(args.repeats):
                for s in scenarios:
                    for t in targets if r % 2 == 0 else targets[::-1]:
                        cell = results[(t.name, s)]
                        if cell["calls"] is not None:
                            us = t.cpu_us(s, args.n, args.c)
                            if us is not None:
                                cell["cpu"].append(us)
                                cell["rounds"][r] = us
        finally:
            for t in targets:
                t.stop()
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)
    print(
        f"# request cost: -n {args.n} -c {args.c}, CPU median of {args.repeats} interleaved rounds; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    names = [t.name for t in targets]
    print(f"| scenario | {' | '.join(f'{name}: calls/req, CPU us/req' for name in names)} |")
    print("|---|" + "---|" * len(names))
    for s in scenarios:
        cells = []
        for name in names:
            cell = results[(name, s)]
            if cell["calls"] is None:
                cells.append("n/a")
            else:
                cpu = f"{statistics.median(cell['cpu']):.0f}" if cell["cpu"] else "-"
                cells.append(f"{cell['calls']:.1f}, {cpu}")
        print(f"| {s} | {' | '.join(cells)} |")
    # The paired figure: each round's ratio (the cells ran back to back, under the same load), then
    # their median; steadier than the ratio of two medians when the load moves between rounds.
    for name in names[1:]:
        for s in scenarios:
            mine, other = results[(names[0], s)]["rounds"], results[(name, s)]["rounds"]
            ratios = sorted(mine[r] / other[r] for r in mine if r in other)
            if ratios:
                print(
                    f"# {s}: {names[0]}/{name} CPU, median of {len(ratios)} per-round ratios"
                    f" {statistics.median(ratios):.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f})"
                )
    if args.top:
        for s in scenarios:
            for t in targets:
                cell = results[(t.name, s)]
                if cell["calls"] is not None:
                    print(f"\n## {s} @ {t.name} ({t.checkout})")
                    print("\n".join(cell["lines"]))


if __name__ == "__main__":
    main()
