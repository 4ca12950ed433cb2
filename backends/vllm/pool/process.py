"""Worker processes: spawn one through the launcher, stop its whole process group.

Contract:
- :func:`spawn` starts ``launcher.py`` (see its docstring) as the leader of a new session
  and process group whose id is its pid; stdout and stderr of everything in the group go
  to ``log_path`` (appended; a header line marks each start). It returns at once.
- :func:`stop` sends SIGTERM to the group, SIGKILL after ``timeout``, and returns only
  once no live (non-zombie) process is left in the group, so a caller may hand the
  worker's GPUs and port to a new process afterwards. Idempotent.
- :func:`group_alive` / :func:`tail` read /proc and the log file; cheap enough to call
  on every state change.
- :func:`foreign_listener` names the process outside the group that listens on a port (a
  race on the port range: another program took it between the pool's bind probe and the
  worker's own bind), so the supervisor never counts a stranger's answers as its worker's.

Linux only (prctl, /proc).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import backends.vllm.pool.launcher as launcher  # the module itself (its file is the launcher script), not the package

__all__ = ["WorkerProcess", "foreign_listener", "group_alive", "spawn", "stop", "tail"]

_LAUNCHER = launcher.__file__


class WorkerProcess:
    """One spawned launcher (and the worker under it). ``pid`` is also the process group id."""

    __slots__ = ("log_path", "pid", "proc", "started_at")

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.log_path = log_path
        self.started_at = time.time()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self) -> int:
        return await self.proc.wait()


async def spawn(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, *, grace: float, header: str = ""
) -> WorkerProcess:
    argv = [sys.executable, "-I", "-S", _LAUNCHER, "--parent", str(os.getpid()), "--grace", f"{grace:g}", "--"]
    with _open_log(log_path, f"{header} $ {' '.join(command)}") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
    return WorkerProcess(proc, log_path)


def _open_log(path: Path, header: str) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = open(path, "ab")  # the caller closes it once the child has its copy
    log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {header}\n".encode())
    log.flush()
    return log


def _processes() -> Iterator[tuple[int, bytes, int]]:
    """(pid, state letter, process group id) of every process /proc shows."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        yield int(entry), fields[0], int(fields[2])


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group ``pgid``."""
    return any(state not in (b"Z", b"X") and group == pgid for _, state, group in _processes())


def foreign_listener(pgid: int, port: int) -> int | None:
    """The pid of a process outside group ``pgid`` that holds a TCP socket listening on ``port``
    (this network namespace), or None: the listener is the group's own, or none is found, or its
    owner is not readable (another user's: trusted, as a container runtime's proxy would be)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    others: list[int] = []
    for pid, _, group in _processes():
        if group != pgid:
            others.append(pid)
        elif _holds(pid, inodes):
            return None
    return next((pid for pid in others if _holds(pid, inodes)), None)


def _listening_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # local_address is HEXIP:HEXPORT; state 0A is LISTEN; column 9 is the socket's inode.
            if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def _holds(pid: int, inodes: set[str]) -> bool:
    wanted = {f"socket:[{inode}]" for inode in inodes}
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                return True
        except OSError:
            continue
    return False


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def stop(worker: WorkerProcess, grace: float) -> int | None:
    """SIGTERM the group, SIGKILL it after ``grace`` seconds; return once nothing of it is alive."""
    if group_alive(worker.pid):
        _killpg(worker.pid, signal.SIGTERM)
    try:
        # The launcher escalates to SIGKILL itself after ``grace``; give it a moment more.
        await asyncio.wait_for(asyncio.shield(worker.wait()), grace + 2.0)
    except TimeoutError:
        pass
    # A pgid is not reused while any process of the group lives, so this cannot hit a stranger.
    if group_alive(worker.pid):
        _killpg(worker.pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(asyncio.shield(worker.wait()), 5.0)
    except TimeoutError:  # pragma: no cover - SIGKILL of our own child does not fail
        pass
    await _until_gone(worker.pid, 10.0)
    return worker.returncode


async def _until_gone(pgid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while group_alive(pgid):
        if time.monotonic() >= deadline:
            return False
        _killpg(pgid, signal.SIGKILL)
        await asyncio.sleep(0.02)
    return True


def tail(path: Path, lines: int = 20) -> list[str]:
    """The last ``lines`` lines of a log file (empty if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read()
    except OSError:
        return []
    kept: deque[str] = deque(maxlen=lines)
    for line in data.decode("utf-8", "replace").splitlines():
        kept.append(line.rstrip())
    return list(kept)
