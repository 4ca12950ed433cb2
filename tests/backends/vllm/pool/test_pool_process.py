"""Process handling without a pool: the launcher, stop(), the GPU ledger, port allocation."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.vllm.pool import launcher
from backends.vllm.pool.process import group_alive, spawn, stop, tail
from backends.vllm.pool.resources import GpuLedger, PortAllocator
from tests.backends.vllm.pool.conftest import live_pids_with, wait_no_pids

LAUNCHER = [sys.executable, "-I", "-S", launcher.__file__]
DEAF = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"  # ignores SIGTERM


def worker(tag: str, body: str, *, deaf: bool = False, child: bool = True) -> list[str]:
    """A python worker whose argv (and its child's, an "engine") carries ``tag``, then runs ``body``."""
    prelude = "import sys, time\n" + (DEAF if deaf else "")
    if child:
        engine = (DEAF if deaf else "") + "import time\ntime.sleep(60)\n"
        prelude += f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {engine!r}, sys.argv[1]])\n"
    return [sys.executable, "-c", prelude + body, tag]


def test_launcher_exits_with_the_worker_status_and_cleans_up_after_it(tag: str) -> None:
    # The worker exits 3 and leaves its "engine" child behind: the launcher reaps and kills it.
    cmd = [*LAUNCHER, "--parent", str(os.getpid()), "--grace", "1", "--", *worker(tag, "sys.exit(3)")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert done.returncode == 3
    assert "worker exited with status 3" in done.stderr
    assert wait_no_pids(tag, within=1.0) == []


def test_launcher_refuses_to_start_when_its_parent_is_already_gone(tag: str) -> None:
    cmd = [*LAUNCHER, "--parent", "1", "--grace", "1", "--", *worker(tag, "time.sleep(60)")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    assert done.returncode == 1 and "not starting" in done.stderr
    assert live_pids_with(tag) == []


def test_launcher_stops_everything_when_its_parent_dies(tag: str) -> None:
    # A middle process starts the launcher (as the gateway does) and is then SIGKILLed.
    cmd = [*LAUNCHER, "--parent", "PARENT", "--grace", "0.5", "--", *worker(tag, "time.sleep(60)", deaf=True)]
    middle = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, subprocess, sys, time\n"
            f"cmd = [str(os.getpid()) if a == 'PARENT' else a for a in {cmd!r}]\n"
            "subprocess.Popen(cmd, start_new_session=True)\n"
            "time.sleep(60)\n",
            tag,
        ]
    )
    try:
        deadline = time.monotonic() + 10
        while len(live_pids_with(tag)) < 4:  # middle, launcher, worker, engine
            assert time.monotonic() < deadline, live_pids_with(tag)
            time.sleep(0.02)
    finally:
        middle.kill()
        middle.wait()
    # The worker ignores SIGTERM: the launcher SIGKILLs the group after its grace period.
    assert wait_no_pids(tag, within=3.0) == []


async def test_stop_returns_only_when_the_whole_group_is_gone(tag: str, tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    body = "print('UP-NOW', flush=True)\ntime.sleep(60)\n"
    proc = await spawn(worker(tag, body, deaf=True), dict(os.environ), log, grace=0.3, header="w")
    deadline = time.monotonic() + 10
    while "UP-NOW" not in tail(log):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert group_alive(proc.pid) and len(live_pids_with(tag)) == 3  # launcher, worker, engine
    started = time.monotonic()
    await stop(proc, 0.3)
    assert time.monotonic() - started < 20.0  # timing-only sanity: killed, not left to its 60 s sleep
    assert not group_alive(proc.pid)
    assert live_pids_with(tag) == []
    lines = tail(log)
    assert lines[0].startswith("=== ") and " w $ " in lines[0]
    assert "UP-NOW" in lines
    assert any("killed 2 process(es) that outlived SIGTERM" in line for line in lines)


def test_tail_of_a_missing_or_long_log(tmp_path: Path) -> None:
    assert tail(tmp_path / "none.log") == []
    path = tmp_path / "long.log"
    path.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert tail(path, 3) == ["line 997", "line 998", "line 999"]


def test_gpu_ledger_hands_a_gpu_over_only_after_release() -> None:
    ledger = GpuLedger()
    ledger.acquire([0, 1], owner=0)
    ledger.acquire([0, 1], owner=0)  # the same worker again: fine
    with pytest.raises(RuntimeError, match=r"GPU\(s\) \[1\] are still held"):
        ledger.acquire([1, 2], owner=1)
    assert ledger.holder(2) is None  # nothing taken by the failed acquire
    ledger.release([0, 1], owner=0)
    ledger.acquire([1, 2], owner=1)
    assert (ledger.holder(0), ledger.holder(1)) == (None, 1)


def test_port_allocator_skips_busy_ports_and_rotates() -> None:
    # Three ports below the ephemeral range, the first of them held by someone else.
    for _ in range(50):
        port = random.randrange(20_000, 30_000)
        with socket.socket() as busy:
            try:
                busy.bind(("127.0.0.1", port))
            except OSError:
                continue
            busy.listen()
            ports = PortAllocator(port, port + 2, "127.0.0.1")
            try:
                first, second = ports.allocate(), ports.allocate()
            except RuntimeError:  # port+1 or port+2 happened to be taken: try elsewhere
                continue
            assert (first, second) == (port + 1, port + 2)
            with pytest.raises(RuntimeError, match="no free port"):
                ports.allocate()
            ports.release(first)
            assert ports.allocate() == first
            return
    pytest.fail("no free port range found")
