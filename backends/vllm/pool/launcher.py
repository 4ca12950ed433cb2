"""A worker's launcher: the process the supervisor spawns, which runs the worker command.

Run as a script with the gateway's interpreter, stdlib only (``python -I -S launcher.py``)::

    launcher.py --parent PID --grace SECONDS -- COMMAND [ARGS...]

Why it exists: ``vllm serve`` is a tree of processes (API server, engine core, ...), and
killing only its top process leaves the engine alive. The supervisor starts this launcher
as the leader of a new session and process group; the launcher then

- asks the kernel for SIGTERM when its parent (the gateway) dies (``PR_SET_PDEATHSIG``),
  and exits at once if the gateway already died before that;
- becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a worker process whose parent
  died is re-parented to it instead of escaping to init;
- runs COMMAND as its child (same process group, signal mask restored, its own
  ``PR_SET_PDEATHSIG`` towards the launcher);
- on SIGTERM/SIGINT/SIGHUP (from the supervisor, or the kernel after the gateway died):
  SIGTERM to the whole group and every descendant, SIGKILL to what is left after
  ``--grace`` seconds, then exits;
- when COMMAND exits by itself: the same clean-up of whatever it left behind, then exits
  with COMMAND's status (``128 + signal`` when it was killed by a signal).

So the gateway being SIGKILLed still leaves no worker process behind. The supervisor
also signals the group itself, so a launcher killed by SIGKILL does not leak either.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

__all__ = ["main"]

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _prctl(option: int, value: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(option, value, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), f"prctl({option}) failed")


def _say(message: str) -> None:
    sys.stderr.write(f"[launcher {os.getpid()}] {message}\n")
    sys.stderr.flush()


def _descendants(root: int) -> set[int]:
    """Live (non-zombie) processes below ``root`` or in its process group, from /proc."""
    parent: dict[int, int] = {}
    group: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] in ("Z", "X"):
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        if int(fields[2]) == root:
            group.add(pid)
    found = set(group)
    changed = True
    while changed:
        changed = False
        for pid, ppid in parent.items():
            if pid not in found and (ppid == root or ppid in found):
                found.add(pid)
                changed = True
    found.discard(root)
    return found


def _signal_all(sig: int) -> int:
    me = os.getpid()
    targets = _descendants(me)
    for pid in targets:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    return len(targets)


_statuses: dict[int, int] = {}  # wait statuses of reaped children, by pid


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _statuses[pid] = status


def _clean_up(grace: float) -> None:
    """SIGTERM everything below us, SIGKILL what outlives ``grace``."""
    if not _signal_all(signal.SIGTERM):
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap()
        if not _descendants(os.getpid()):
            return
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)
    left = _signal_all(signal.SIGKILL)
    if left:
        _say(f"killed {left} process(es) that outlived SIGTERM by {grace:g}s")
    deadline = time.monotonic() + 5.0
    while _descendants(os.getpid()) and time.monotonic() < deadline:
        _reap()
        signal.sigtimedwait({signal.SIGCHLD}, 0.05)
    _reap()


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _child_setup() -> None:
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: list[str]) -> int:
    parent, grace, command = _parse(argv)
    # Block the signals we wait for before anything can send them; the child gets a clean mask.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS | {signal.SIGCHLD})
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the gateway died before we could ask to be told
        _say(f"parent {parent} is gone; not starting")
        return 1
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        child = subprocess.Popen(command, preexec_fn=_child_setup, close_fds=True)
    except OSError as exc:
        _say(f"cannot start {command[0]!r}: {exc}")
        return 127
    while child.pid not in _statuses:
        info = signal.sigwaitinfo(_SIGNALS | {signal.SIGCHLD})
        if info.si_signo == signal.SIGCHLD:
            _reap()
            continue
        _say(f"got {signal.Signals(info.si_signo).name}; stopping the worker")
        _clean_up(grace)
        _reap()
        status = _statuses.get(child.pid)
        return _exit_code(status) if status is not None else 128 + signal.SIGKILL
    code = _exit_code(_statuses[child.pid])
    _say(f"worker exited with status {code}")
    _clean_up(grace)
    return code


def _parse(argv: list[str]) -> tuple[int, float, list[str]]:
    try:
        split = argv.index("--")
        opts = dict(zip(argv[:split:2], argv[1:split:2], strict=True))
        command = argv[split + 1 :]
        parent, grace = int(opts["--parent"]), float(opts["--grace"])
    except (ValueError, KeyError):
        raise SystemExit("usage: launcher.py --parent PID --grace SECONDS -- COMMAND [ARGS...]") from None
    if not command:
        raise SystemExit("launcher.py: no command given")
    return parent, grace, command


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
