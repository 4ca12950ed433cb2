"""Instructions per request of one ``gateway serve``, counted by callgrind: a CPU figure that does not move.

    .venv/bin/python bench/instructions.py                                  # this checkout, the vLLM adapter
    .venv/bin/python bench/instructions.py --kind openai --ref /work/wt/base  # the openai relay, two checkouts
    .venv/bin/python bench/instructions.py -n 200 --scenarios chat_st,resp_st,chat_tools,resp_tools

CPU time per request (bench/request_cost.py) moves with the machine's load: on these shared
two-core machines the same code's same-run ratio of one scenario to another ranged 1.29x to 1.45x
in one morning. Callgrind counts the user-space instructions the gateway process executes, which
are the same run after run (about 1.5 %), whatever else runs. It misses what the kernel does (the
socket writes: a bigger body costs more there) and what the instructions cost in time (cache
misses), so it is a proxy for CPU, not CPU: read it beside request_cost's figures.

Each checkout's gateway runs under ``valgrind --tool=callgrind --instr-atstart=no`` (its own
``.venv/bin/python``, the same config as request_cost.py: one ``--kind`` backend over
bench/fake_upstream.py), is warmed up uncounted, then per scenario (request_cost.py's, the same
requests) counting is switched on with ``callgrind_control -i on`` for exactly ``-n`` requests and
the total is read from the dump. Needs ``valgrind`` (Debian: ``apt-get install valgrind``); about
20 s per checkout and scenario set at ``-n 200`` (the gateway runs ~50x slower under callgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import request_cost as rc

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _config(work: Path, kind: str, upstream: int, port: int) -> Path:
    config = work / "gateway.yaml"
    config.write_text(
        f"""server: {{host: 127.0.0.1, port: {port}, drain_timeout: 1}}
backends:
  - {{name: upstream, type: {kind}, base_url: "http://127.0.0.1:{upstream}/v1", api_key: sk-bench}}
models:
  - name: bench
    routes:
      - {{backend: upstream, model: bench}}
    endpoints: [completions, chat, responses]
"""
    )
    return config


def _total(dump: Path) -> int:
    """The dump's event total: its ``totals:`` line (a ``summary:`` line near the top may read 0)."""
    for line in reversed(dump.read_text(errors="replace").splitlines()):
        if line.startswith("totals:"):
            return int(line.split()[1])
    raise RuntimeError(f"no total in {dump}")


def measure(checkout: Path, kind: str, scenarios: list[str], n: int, upstream: int) -> dict[str, float]:
    """Instructions per request of ``checkout``'s gateway for each scenario."""
    work = Path(tempfile.mkdtemp(prefix="instructions-"))
    port = rc.free_port()
    config = _config(work, kind, upstream, port)
    out = work / "callgrind.out"
    serve = (
        f"import sys; sys.path.insert(0, {str(checkout)!r}); from gateway.cli import main; "
        f"sys.exit(main(['serve', '--config', {str(config)!r}, '--port', '{port}', '--log-level', 'WARNING']))"
    )
    command = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
    with open(work / "log", "wb") as log:
        gateway = subprocess.Popen(
            [*command, str(checkout / ".venv/bin/python"), "-c", serve],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        rc.wait_port(port, gateway, timeout=600.0)
        for scenario in scenarios:
            asyncio.run(rc.drive(port, scenario, 30, 4))  # warm-up, not counted
        results: dict[str, float] = {}
        for scenario in scenarios:
            control = ["callgrind_control"]
            subprocess.run([*control, "-z", str(gateway.pid)], capture_output=True, check=True)
            subprocess.run([*control, "-i", "on", str(gateway.pid)], capture_output=True, check=True)
            _ok, bad = asyncio.run(rc.drive(port, scenario, n, 4))
            subprocess.run([*control, "-i", "off", str(gateway.pid)], capture_output=True, check=True)
            subprocess.run([*control, "-d", scenario, str(gateway.pid)], capture_output=True, check=True)
            if bad:
                raise RuntimeError(f"{checkout.name} {scenario}: {bad} of {n} requests failed")
            time.sleep(0.5)  # the dump is written by the gateway's process
            dump = max(glob.glob(f"{out}*"), key=os.path.getmtime)
            results[scenario] = _total(Path(dump)) / n
        return results
    finally:
        gateway.terminate()
        try:
            gateway.wait(30)
        except subprocess.TimeoutExpired:
            gateway.kill()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", type=Path, action="append", default=[], help="another checkout (with .venv)")
    ap.add_argument("--kind", default="vllm", help="the backend type: vllm (Responses over the chat bridge) or openai")
    ap.add_argument("-n", type=int, default=200, help="counted requests per scenario")
    ap.add_argument("--scenarios", default="chat_ns,resp_ns,chat_st,resp_st")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("bench/instructions.py needs valgrind (apt-get install valgrind)")
    scenarios = args.scenarios.split(",")
    checkouts = [ROOT, *(path.resolve() for path in args.ref)]
    upstream_port = rc.free_port()
    upstream = subprocess.Popen(
        [sys.executable, str(HERE / "fake_upstream.py"), "--port", str(upstream_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    try:
        rc.wait_port(upstream_port, upstream)
        table = {checkout: measure(checkout, args.kind, scenarios, args.n, upstream_port) for checkout in checkouts}
    finally:
        upstream.terminate()
    print(f"# instructions per request (callgrind, user space), --kind {args.kind}, -n {args.n}")
    print("| scenario | " + " | ".join(checkout.name for checkout in checkouts) + " |")
    print("|---|" + "---|" * len(checkouts))
    for scenario in scenarios:
        cells = (f"{table[checkout][scenario] / 1000:.1f}K" for checkout in checkouts)
        print(f"| {scenario} | " + " | ".join(cells) + " |")
    for chat, responses in (("chat_ns", "resp_ns"), ("chat_st", "resp_st"), ("chat_tools", "resp_tools")):
        if chat in scenarios and responses in scenarios:
            ratios = ", ".join(f"{c.name} {table[c][responses] / table[c][chat]:.3f}x" for c in checkouts)
            print(f"# {responses} / {chat}: {ratios}")


if __name__ == "__main__":
    main()
