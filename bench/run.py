"""Proxy-overhead benchmark: a fake upstream called directly, through the thinnest aiohttp
pass-through, and through ``gateway serve`` (and LiteLLM when given), on pinned cores.

  .venv/bin/python bench/run.py                          # ~2 min: direct, thin, gateway x 3 scenarios
  .venv/bin/python bench/run.py --duration 5 --warmup 2  # quicker
  .venv/bin/python bench/run.py --targets direct,thin,gateway,gateway-vllm --repeats 3 --transport aiohttp
  .venv/bin/python bench/run.py --mem --targets thin,gateway          # + 1000 open streams, peak RSS
  .venv/bin/python bench/run.py --litellm-cmd 'litellm --config {config} --port {port}'

The fake upstream (bench/fake_upstream.py) and the client (bench/loadgen.py) share core 1;
each proxy runs alone on core 0 (``taskset``; no pinning on a 1-core machine). Scenarios:
``ns_c1`` (non-stream, 16 tokens, 1 connection), ``ns_c64``, ``st_c64`` (stream, 64 tokens,
64 connections), ``emb_c64`` (embeddings: one 64-word input, 1,024-dim float vectors, 64
connections), ``emb_batch`` (256 such inputs, 8 connections); any ``[chat_|resp_]ns|st_c<N>[_t<tokens>]``
works: ``chat_`` sends the same words and limit as one user message to /v1/chat/completions
(``chat_ns_c64``, ``chat_st_c64``), ``resp_`` as a Responses ``input`` to /v1/responses (``resp_ns_c64``,
``resp_st_c64``), and the tables add each chat cell's ratio to the completions cell, each Responses
cell's to the chat cell, of the same target and run. Each closed-loop run is --warmup +
--duration seconds; with --repeats the table shows medians. ``gateway`` runs
``<venv>/bin/gateway serve --config <generated yaml> --port P`` with a ``type: openai`` backend
named ``upstream`` serving model ``bench`` (``gateway-vllm``: the same with ``type: vllm``);
--gateway-cmd replaces the command ({config}, {port}, {upstream_url} are substituted).
``gateway-trace<PCT>`` is ``gateway`` with tracing on (``telemetry``: PCT % of requests sampled, OTLP/HTTP
to the fake upstream's ``/v1/traces``, which drops what it gets): tracing's cost, as ratios to ``gateway``
in the same run.

  .venv/bin/python bench/run.py --targets gateway,gateway-trace0,gateway-trace1,gateway-trace100

``--workers 1,2`` adds ``gateway-w2`` (``gateway serve --workers 2``, pinned to --workers-cpus,
by default both cores): its CPU per request sums the control process and every worker.

  .venv/bin/python bench/run.py --targets gateway --workers 1,2 --scenarios ns_c64,st_c64

Reported per cell: req/s (streams/s), latency p50/p90/p99, TTFT p50 (first ``data:`` event),
errors, throughput ratios vs direct / thin / LiteLLM, added p50 vs direct, the proxy's CPU (% of
a core and microseconds per upstream request), its RSS after the cell, and upstream TCP
connections opened / requests served in the cell (keep-alive reuse). Per target: start-up time
(spawn to first 200 on /health) and RSS. Raw results: bench-results/<stamp>.json.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from procs import AUTH, busy_pct, check, core_ticks, cpu_s, memory_mb, pin, request, start, stop, stop_all, wait_http
from report import summarise, table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = sys.executable
OFFLINE = "http://127.0.0.1:9/"  # the discard port: any phone-home fails at once
LITELLM_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_MODEL_COST_MAP_URL": OFFLINE,
    "NO_PROXY": "*",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_BLOG_POSTS_URL": OFFLINE,
    "HF_HUB_OFFLINE": "1",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_ANTHROPIC_BETA_HEADERS_URL": OFFLINE,
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_AUTOROUTER_PRESETS_URL": OFFLINE,
    "DISABLE_ADMIN_UI": "True",
}


def scenario(name: str) -> dict[str, Any]:
    e = re.fullmatch(r"emb_(c(\d+)|batch)", name)  # emb_c64: one 64-word input; emb_batch: 256 of them, 8 connections
    if e:
        inputs = 256 if e.group(1) == "batch" else 1
        return {"id": name, "stream": False, "c": int(e.group(2) or 8), "tokens": 64, "chat": False, "embed": inputs}
    m = re.fullmatch(r"(chat_|resp_)?(ns|st)_c(\d+)(?:_t(\d+))?", name)
    if not m:
        sys.exit(f"bad scenario {name!r}: want ns_c1, ns_c64, st_c64, st_c64_t128, chat_ns_c64 ...")
    stream = m.group(2) == "st"
    return {
        "id": name,
        "stream": stream,
        "c": int(m.group(3)),
        "tokens": int(m.group(4) or (64 if stream else 16)),
        "chat": m.group(1) == "chat_",
        "responses": m.group(1) == "resp_",
    }


def gateway_config(
    path: Path, port: int, upstream_port: int, kind: str, transport: str | None, trace_pct: float | None = None
) -> None:
    extra = f"    transport: {transport}\n" if transport else ""
    # gateway-trace<PCT>: OTLP/HTTP export to the fake upstream's /v1/traces, which drops what it gets.
    telemetry = (
        f"telemetry: {{otlp_endpoint: 'http://127.0.0.1:{upstream_port}', sample_ratio: {trace_pct / 100:g}}}\n"
        if trace_pct is not None
        else ""
    )
    path.write_text(f"""# generated by bench/run.py
server: {{host: 127.0.0.1, port: {port}, drain_timeout: 1}}
{telemetry}backends:
  - name: upstream
    type: {kind}
    base_url: http://127.0.0.1:{upstream_port}/v1
    api_key: sk-bench
{extra}models:
  - name: bench
    routes:
      - {{backend: upstream, model: bench}}
    endpoints: [completions, chat, responses, embeddings]
""")


def target_spec(name: str, args: argparse.Namespace, port: int, upstream_port: int, work: Path) -> dict[str, Any]:
    """argv, env, cwd and health path that start target ``name`` on ``port``."""
    upstream_url = f"http://127.0.0.1:{upstream_port}/v1"
    spec: dict[str, Any] = {
        "name": name,
        "port": port,
        "health": "/health",
        "env": {},
        "cwd": ROOT,
        "cpus": args.proxy_cpus,
    }
    workers = 1
    trace_pct: float | None = None
    if re.fullmatch(r"gateway-w\d+", name):  # gateway serve --workers N
        name, workers, spec["cpus"] = "gateway", int(name[len("gateway-w") :]), args.workers_cpus
    elif m := re.fullmatch(r"gateway-trace(\d+(?:\.\d+)?)", name):  # tracing on, PCT % of requests sampled
        name, trace_pct = "gateway", float(m.group(1))
    if name == "thin":
        spec["argv"] = [PY, str(HERE / "thin_proxy.py"), "--port", str(port), "--upstream", upstream_url[:-3]]
    elif name in ("gateway", "gateway-vllm"):
        config = work / f"{name}-{port}.yaml"
        kind = "vllm" if name == "gateway-vllm" else "openai"
        gateway_config(config, port, upstream_port, kind, args.transport, trace_pct)
        exe = Path(sys.prefix) / "bin" / "gateway"
        cmd = args.gateway_cmd
        if cmd:
            spec["argv"] = ["bash", "-c", cmd.format(config=config, port=port, upstream_url=upstream_url)]
        else:
            base = [str(exe)] if exe.exists() else [PY, "-m", "gateway"]
            spec["argv"] = [*base, "serve", "--config", str(config), "--port", str(port)]
            spec["argv"] += ["--workers", str(workers)] if workers > 1 else []
    elif name == "litellm":
        config = work / f"litellm-{port}.yaml"
        config.write_text(
            f"model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
            f"      api_base: {upstream_url}\n      api_key: sk-bench\n"
        )
        spec["argv"] = ["bash", "-c", args.litellm_cmd.format(config=config, port=port, upstream_url=upstream_url)]
        AUTH[port] = "sk-bench-" + secrets.token_hex(16)
        spec["health"], spec["env"] = "/health/liveliness", LITELLM_ENV | {"LITELLM_MASTER_KEY": AUTH[port]}
    else:
        sys.exit(
            f"unknown target {name!r}: direct, thin, gateway, gateway-vllm, gateway-wN, gateway-traceP "
            "(litellm via --litellm-cmd)"
        )
    return spec


def launch(spec: dict[str, Any], args: argparse.Namespace, logs: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Start a proxy pinned to the proxy core; (process, seconds from spawn to first 200 on health)."""
    t0 = time.perf_counter()
    proc = start(
        pin(spec["cpus"]) + spec["argv"], logs / f"{spec['name']}-{spec['port']}.log", spec["env"], spec["cwd"]
    )
    try:
        up = wait_http(spec["port"], "GET", spec["health"], proc, args.ready_timeout, since=t0)
        wait_http(
            spec["port"],
            "POST",
            "/v1/completions",
            proc,
            args.ready_timeout,
            {"model": "bench", "prompt": "ready?", "max_tokens": 2},
        )
    except RuntimeError:
        stop(proc)
        raise
    return proc, up


def loadgen(
    args: argparse.Namespace,
    port: int,
    sc: dict[str, Any],
    duration: float,
    warmup: float,
) -> list[str]:
    if sc.get("embed"):
        path = "/v1/embeddings"
    else:
        path = (
            "/v1/chat/completions" if sc.get("chat") else "/v1/responses" if sc.get("responses") else "/v1/completions"
        )
    argv = [
        PY,
        str(HERE / "loadgen.py"),
        "--url",
        f"http://127.0.0.1:{port}{path}",
        "-c",
        str(sc["c"]),
        "-d",
        str(duration),
        "-w",
        str(warmup),
        "--max-tokens",
        str(sc["tokens"]),
        "--procs",
        str(args.client_procs),
    ]
    argv += ["--auth", AUTH[port]] if port in AUTH else []
    argv += ["--chat"] if sc.get("chat") else []
    argv += ["--embed", str(sc["embed"]), "--embed-tokens", str(sc["tokens"])] if sc.get("embed") else []
    argv += ["--responses"] if sc.get("responses") else []
    return pin(args.client_cpus) + argv + (["--stream"] if sc["stream"] else [])


def port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is fine, a listener is not
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def upstream_stats(port: int) -> dict[str, Any]:
    try:
        return orjson.loads(request(port, "GET", "/stats", timeout=5)[1])  # type: ignore[no-any-return]
    except (OSError, orjson.JSONDecodeError):
        return {}


def measure(args: argparse.Namespace, port: int, pid: int | None, sc: dict[str, Any]) -> dict[str, Any]:
    us0, cpu0, t0 = upstream_stats(args.upstream_port), cpu_s(pid) if pid else 0.0, time.perf_counter()
    up0, kids0, ticks0 = cpu_s(args.upstream_pid), resource.getrusage(resource.RUSAGE_CHILDREN), core_ticks()
    done = subprocess.run(
        loadgen(args, port, sc, args.duration, args.warmup),
        capture_output=True,
        text=True,
        timeout=args.warmup + args.duration + 180,
    )
    wall, cpu1, us1 = time.perf_counter() - t0, cpu_s(pid) if pid else 0.0, upstream_stats(args.upstream_port)
    up1, kids1 = cpu_s(args.upstream_pid), resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = busy_pct(ticks0, core_ticks())
    try:
        res: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, orjson.JSONDecodeError):
        return {"failed": f"loadgen rc={done.returncode}: {done.stderr[-800:]}"}
    client = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
    ours = (cpu1 - cpu0) + (up1 - up0) + client
    res["cpu_pct"] = {
        "upstream": round(100 * (up1 - up0) / wall, 1),
        "client": round(100 * client / wall, 1),
        "cores_busy": busy,
        "others": round(
            max(0.0, (busy.get("cpu", 0) - busy.get("irq", 0)) * (os.cpu_count() or 1) - 100 * ours / wall), 1
        ),
    }
    res["upstream_requests"] = us1.get("requests", 0) - us0.get("requests", 0) - 1  # minus our /stats
    res["upstream_connections"] = us1.get("connections", 0) - us0.get("connections", 0) - 1
    if pid:
        res["proxy_cpu_pct"] = round(100 * (cpu1 - cpu0) / wall, 1)
        res["cpu_us_per_req"] = round(1e6 * (cpu1 - cpu0) / max(1, res["upstream_requests"]), 1)
        res.update(memory_mb(pid))
    return res


def mem_streams(args: argparse.Namespace, name: str, port: int, work: Path, logs: Path) -> dict[str, Any]:
    """Hold --mem-streams slow streams open through a fresh proxy; sample its RSS."""
    spec = target_spec(name, args, port, args.upstream_port + 1, work)
    out: dict[str, Any] = {"target": name, "streams": args.mem_streams}
    try:
        proc, _ = launch(spec, args, logs)
    except RuntimeError as exc:
        return out | {"error": str(exc)}
    out["rss_idle_mb"] = memory_mb(proc.pid)["rss_mb"]
    sc = {"stream": True, "c": args.mem_streams, "tokens": args.mem_tokens}
    lg = subprocess.Popen(loadgen(args, port, sc, args.mem_duration, 2.0), stdout=subprocess.PIPE, text=True)
    peak, open_max = 0.0, 0
    while lg.poll() is None:
        peak = max(peak, memory_mb(proc.pid)["rss_mb"])
        open_max = max(open_max, upstream_stats(args.upstream_port + 1).get("open", 0) - 1)
        time.sleep(0.1)
    res = orjson.loads(lg.communicate()[0].strip().splitlines()[-1])
    stop(proc)
    peak = max(peak, out["rss_idle_mb"])
    return out | {
        "peak_rss_mb": peak,
        "kb_per_stream": round(1024 * (peak - out["rss_idle_mb"]) / args.mem_streams, 1),
        "rps": res["rps"],
        "errors": res["errors"],
        "upstream_open_max": open_max,
        "loadgen": res,
    }


def main() -> None:
    two = (os.cpu_count() or 1) >= 2
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per cell")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring (connections ramp up)")
    ap.add_argument("--scenarios", default="ns_c1,ns_c64,st_c64")
    ap.add_argument("--targets", default="direct,thin,gateway", help="direct,thin,gateway,gateway-vllm")
    ap.add_argument("--repeats", type=int, default=1, help="runs per cell; the table shows medians")
    ap.add_argument("--transport", help="the backend's transport: key (httptools, aiohttp, httpx); default: omitted")
    ap.add_argument("--gateway-cmd", default="", help="shell command; {config} {port} {upstream_url} substituted")
    ap.add_argument(
        "--litellm-cmd", default="", help="adds a litellm target, e.g. 'litellm --config {config} --port {port}'"
    )
    ap.add_argument("--mem", action="store_true", help="also run mem_streams on every proxy target")
    ap.add_argument("--mem-streams", type=int, default=1000)
    ap.add_argument("--mem-tokens", type=int, default=64)
    ap.add_argument("--mem-duration", type=float, default=8.0)
    ap.add_argument("--token-delay-ms", type=float, default=50.0, help="per-chunk delay of the mem_streams upstream")
    ap.add_argument("--proxy-cpus", default="0" if two else "")
    ap.add_argument("--workers", default="1", help="gateway worker counts, e.g. 1,2: adds gateway-wN targets")
    ap.add_argument("--workers-cpus", default="0,1" if two else "", help="cores of gateway-wN (N > 1)")
    ap.add_argument("--client-cpus", default="1" if two else "")
    ap.add_argument("--upstream-cpus", default="1" if two else "")
    ap.add_argument("--client-procs", type=int, default=1)
    ap.add_argument("--base-port", type=int, default=18100)
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--lock", default="/tmp/completions-gateway-bench.lock", help="serialises runs on one machine")
    ap.add_argument("--out", type=Path, default=ROOT / "bench-results")
    args = ap.parse_args()
    lock = open(args.lock, "a")  # held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(
            f"[bench] another run holds {args.lock}; waiting for it (two runs would skew each other)",
            file=sys.stderr,
            flush=True,
        )
        fcntl.flock(lock, fcntl.LOCK_EX)
    args.upstream_port = args.base_port + 1
    scens = [scenario(s) for s in args.scenarios.split(",") if s]
    targets = [t for t in args.targets.split(",") if t] + (["litellm"] if args.litellm_cmd else [])
    counts = [int(n) for n in args.workers.split(",") if n]
    if "gateway" in targets:  # gateway-wN right after gateway, so the two are measured close in time
        at = targets.index("gateway") + 1
        targets[at:at] = [f"gateway-w{n}" for n in counts if n > 1]
        if 1 not in counts:
            targets.remove("gateway")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    work = logs = args.out / f"{stamp}-logs"
    logs.mkdir()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: list[dict[str, Any]] = []
    info: dict[str, dict[str, Any]] = {}
    mem: list[dict[str, Any]] = []
    ports = (args.upstream_port, args.upstream_port + 1, *range(args.base_port + 10, args.base_port + 40))
    busy_ports = [p for p in ports if not port_free(p)]
    if busy_ports:
        sys.exit(f"ports {busy_ports} are in use (another benchmark running?); pick another --base-port")
    ticks = core_ticks()
    time.sleep(2)
    background = busy_pct(ticks, core_ticks()).get("cpu", 0.0) * (os.cpu_count() or 1)
    if background > 10:
        print(
            f"[bench] warning: other processes use {background:.0f}% of a core; figures will be noisy",
            file=sys.stderr,
            flush=True,
        )
    try:
        for port, delay in ((args.upstream_port, 0.0), (args.upstream_port + 1, args.token_delay_ms)):
            if delay == 0.0 or args.mem:
                argv = [PY, str(HERE / "fake_upstream.py"), "--port", str(port), "--token-delay-ms", str(delay)]
                up = start(pin(args.upstream_cpus) + argv, logs / f"upstream-{port}.log")
                wait_http(port, "GET", "/stats", up, 30)
                args.upstream_pid = up.pid if delay == 0.0 else args.upstream_pid
        for i, name in enumerate(targets):
            proc, pid, port = None, None, args.upstream_port
            entry = info.setdefault(name, {})
            if name != "direct":
                spec = target_spec(name, args, args.base_port + 10 + i, args.upstream_port, work)
                port = spec["port"]
                try:
                    proc, entry["startup_s"] = launch(spec, args, logs)
                except RuntimeError as exc:
                    entry["error"] = f"{exc} (log: {logs}/{name}-{port}.log)"
                    print(f"[bench] {name}: {entry['error']}", file=sys.stderr, flush=True)
                    continue
                pid = proc.pid
                entry["rss_start_mb"] = memory_mb(pid)["rss_mb"]
            entry["check"] = check(port, "bench", chat=any(sc["chat"] for sc in scens))
            # Rounds, not runs of one scenario: each round measures every scenario once, so a slow
            # spell of the shared machine lands on all of them and same-run ratios (chat vs
            # completions) hold; ~10% drifts between back-to-back runs of one cell were measured.
            for rep in range(args.repeats):
                for sc in scens:
                    res = measure(args, port, pid, sc) | {"target": name, "scenario": sc["id"], "rep": rep}
                    results.append(res)
                    print(
                        f"[bench] {name} {sc['id']} r{rep}: "
                        + orjson.dumps(
                            {k: v for k, v in res.items() if k not in ("detail", "target", "scenario")}
                        ).decode(),
                        file=sys.stderr,
                        flush=True,
                    )
            if proc is not None:
                entry.update(memory_mb(proc.pid))
                stop(proc)
        if args.mem:
            for i, name in enumerate(t for t in targets if t != "direct"):
                mem.append(mem_streams(args, name, args.base_port + 30 + i, work, logs))
                print(f"[bench] mem_streams {name}: {mem[-1]}", file=sys.stderr, flush=True)
    finally:
        stop_all()
    rows = summarise(results, targets, scens, "cpu" + args.client_cpus if args.client_cpus.isdigit() else "cpu")
    text = table(rows, info, mem)
    meta = {
        "stamp": stamp,
        "args": {k: str(v) for k, v in vars(args).items()},
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "background_cpu_pct": background,
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }
    path = args.out / f"{stamp}.json"
    path.write_bytes(
        orjson.dumps(
            {"meta": meta, "targets": info, "summary": rows, "results": results, "mem": mem}, option=orjson.OPT_INDENT_2
        )
    )
    print(text)
    print(
        f"\n{args.duration:g}s measured + {args.warmup:g}s warm-up per cell, repeats={args.repeats}, pinning "
        f"proxy={args.proxy_cpus or '-'} upstream+client={args.client_cpus or '-'}; results {path}"
    )


if __name__ == "__main__":
    main()
