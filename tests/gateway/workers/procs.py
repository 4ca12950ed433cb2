"""A ``gateway serve --workers N`` process tree seen from a test: its workers, one of them killed
and replaced, the whole tree stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def gateway_workers(pid: int) -> list[int]:
    """The control process ``pid``'s gateway workers (not the vLLM servers a pool starts)."""

    def cmdline(child: int) -> list[str]:
        try:
            return Path(f"/proc/{child}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            return []

    return [p for p in children(pid) if cmdline(p)[1:4] == ["-m", "gateway", "worker"]]


async def kill_a_worker(proc: asyncio.subprocess.Process, workers: int = 2, within: float = 60) -> None:
    """SIGKILL one worker and wait until the control process has replaced it."""
    victim = gateway_workers(proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + within
    while not (len(now := gateway_workers(proc.pid)) == workers and victim not in now):
        assert proc.returncode is None, "gateway exited"
        assert time.monotonic() < deadline, "the killed worker did not come back"
        await asyncio.sleep(0.1)


async def stop_gateway(proc: asyncio.subprocess.Process, within: float = 20) -> None:
    """SIGTERM (a drain), SIGKILL after ``within`` seconds."""
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), within)
        except TimeoutError:
            proc.kill()
            await proc.wait()
