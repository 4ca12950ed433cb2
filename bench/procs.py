"""Process and HTTP helpers for bench/run.py: start/stop, CPU time, RSS, tiny HTTP client."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

CLK = os.sysconf("SC_CLK_TCK")
STARTED: list[subprocess.Popen[bytes]] = []  # only ever signal these (and their descendants)
AUTH: dict[int, str] = {}  # port -> bearer token for targets that require one (LiteLLM)


def pin(cpus: str) -> list[str]:
    return ["taskset", "-c", cpus] if cpus else []


def start(
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )
    STARTED.append(proc)
    return proc


def descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(entry))
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    pids = [proc.pid, *descendants(proc.pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        pass
    for pid in [*pids, *descendants(proc.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        pass
    if proc in STARTED:
        STARTED.remove(proc)


def stop_all() -> None:
    for proc in list(reversed(STARTED)):
        stop(proc, grace=3.0)


def cpu_s(pid: int) -> float:
    """utime + stime of pid and its live descendants, in seconds."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, ValueError, IndexError):
            pass
    return total / CLK


def core_ticks() -> dict[str, tuple[int, int, int]]:
    """(total, idle, irq + softirq) jiffies per line of /proc/stat: "cpu" (all cores), "cpu0", ..."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("cpu"):
            name, *values = line.split()
            ticks = [int(v) for v in values[:8]]
            out[name] = (sum(ticks), ticks[3] + ticks[4], ticks[5] + ticks[6])
    return out


def busy_pct(before: dict[str, tuple[int, int, int]], after: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    """Busy % per core between two core_ticks() readings; "cpu" and "irq" (interrupt + softirq time,
    which no process is charged for) are machine-wide, in % of all cores."""
    out = {}
    for name, (total, idle, irq) in after.items():
        if name in before and total > before[name][0]:
            spent = total - before[name][0]
            out[name] = round(100 * (spent - (idle - before[name][1])) / spent, 1)
            if name == "cpu":
                out["irq"] = round(100 * (irq - before[name][2]) / spent, 1)
    return out


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM (peak RSS) in MiB, summed over pid and its descendants."""
    out = {"rss_mb": 0.0, "hwm_mb": 0.0}
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key = "rss_mb" if line.startswith("VmRSS") else "hwm_mb"
                    out[key] += int(line.split()[1]) / 1024
        except OSError:
            pass
    return {k: round(v, 1) for k, v in out.items()}


def request(port: int, method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        data = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"}
        if port in AUTH:
            headers["Authorization"] = f"Bearer {AUTH[port]}"
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_http(
    port: int,
    method: str,
    path: str,
    proc: subprocess.Popen[bytes] | None,
    limit: float,
    body: Any = None,
    since: float | None = None,
) -> float:
    """Poll until ``method path`` answers 200; seconds since ``since`` (default: now)."""
    t0 = since if since is not None else time.perf_counter()
    last = ""
    while time.perf_counter() - t0 < limit:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode} during start-up")
        try:
            status, data = request(port, method, path, body, timeout=5.0)
            if status == 200:
                return time.perf_counter() - t0
            last = f"HTTP {status}: {data[:300]!r}"
        except OSError as exc:
            last = repr(exc)
        time.sleep(0.005)
    raise RuntimeError(f"{method} {path} not 200 after {limit:.0f}s: {last}")


def check(port: int, model: str, chat: bool = False) -> dict[str, Any]:
    """One non-stream and one stream completion through a target: shape, model echo, [DONE].

    ``chat``: the same on /v1/chat/completions (``chat_nonstream_ok``, ``chat_stream_ok``).
    """
    out: dict[str, Any] = {}
    endpoints = [("", "/v1/completions", {"prompt": "hi"})]
    endpoints += [("chat_", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})] if chat else []
    for prefix, path, fields in endpoints:
        status, data = request(port, "POST", path, {"model": model, **fields, "max_tokens": 4})
        try:
            choice = orjson.loads(data)["choices"][0]
            text = choice["message"]["content"] if prefix else choice["text"]
            out[prefix + "nonstream_ok"] = status == 200 and bool(text) and "usage" in orjson.loads(data)
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
            out[prefix + "nonstream_ok"] = False
        if not out[prefix + "nonstream_ok"]:
            out[prefix + "nonstream_error"] = f"HTTP {status}: {data[:300]!r}"
        status, data = request(port, "POST", path, {"model": model, **fields, "max_tokens": 4, "stream": True})
        events = [line for line in data.split(b"\n") if line.startswith(b"data:")]
        out[prefix + "stream_ok"] = status == 200 and len(events) >= 5 and events[-1].strip() == b"data: [DONE]"
        if not out[prefix + "stream_ok"]:
            out[prefix + "stream_error"] = f"HTTP {status}: {data[:300]!r}"
    return out
