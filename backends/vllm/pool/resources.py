"""What a pool's workers run on: GPU sets and ports.

- :func:`plan_gpus` splits ``gpus`` into one set per worker (``tensor_parallel_size`` each);
  ``gpus: all`` asks :func:`detect_gpus` (``nvidia-smi``) first.
- :class:`GpuLedger` records which worker holds which GPU; the supervisor releases a
  worker's GPUs only after all of its processes exited, and acquiring a GPU another
  worker still holds fails, so a GPU is never handed over while its memory may be in use.
- :class:`PortAllocator` hands out ports of ``port_range`` that bind now and no live
  worker of ours holds, with a rotating cursor so a restarted worker gets a fresh port.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable

from schemas.config import VLLMPoolBackendConfig

__all__ = ["GpuLedger", "PortAllocator", "detect_gpus", "plan_gpus"]


async def detect_gpus() -> list[int]:
    """The GPU indices ``nvidia-smi`` lists (for ``gpus: all``)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            "nvidia-smi",
            "--query-gpu=index",
            "--format=csv,noheader",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    except (OSError, TimeoutError) as exc:
        raise RuntimeError(f"gpus: all needs nvidia-smi, which failed: {exc}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"gpus: all: nvidia-smi failed: {err.decode(errors='replace').strip()}")
    gpus = [int(line) for line in out.decode().split() if line.strip().isdigit()]
    if not gpus:
        raise RuntimeError("gpus: all: nvidia-smi lists no GPU")
    return gpus


def plan_gpus(config: VLLMPoolBackendConfig, available: list[int] | None = None) -> list[list[int]]:
    """The GPU set of each worker (empty sets for CPU workers)."""
    gpus = config.gpus
    if gpus == "all":
        ids = list(available or [])
    elif isinstance(gpus, int):
        ids = list(range(gpus))
    else:
        ids = list(gpus)
    tp = config.tensor_parallel_size
    if not ids:
        return [[] for _ in range(config.workers or 1)]
    count = config.workers or len(ids) // tp
    if count < 1 or count * tp > len(ids):
        raise RuntimeError(f"{len(ids)} GPU(s) cannot hold {count or 1} worker(s) of tensor_parallel_size {tp}")
    return [ids[i * tp : (i + 1) * tp] for i in range(count)]


class GpuLedger:
    """Which worker holds which GPU. A GPU is released only after its worker's processes exited."""

    def __init__(self) -> None:
        self._holder: dict[int, int] = {}

    def acquire(self, gpus: list[int], owner: int) -> None:
        busy = [g for g in gpus if self._holder.get(g, owner) != owner]
        if busy:
            raise RuntimeError(f"GPU(s) {busy} are still held by another worker")
        for g in gpus:
            self._holder[g] = owner

    def release(self, gpus: list[int], owner: int) -> None:
        for g in gpus:
            if self._holder.get(g) == owner:
                del self._holder[g]

    def holder(self, gpu: int) -> int | None:
        return self._holder.get(gpu)


class PortAllocator:
    """Ports from ``[lo, hi]`` that bind now and no live worker of ours holds.

    A rotating cursor gives a restarted worker a different port from the one just freed.
    """

    def __init__(self, lo: int, hi: int, host: str) -> None:
        self.lo, self.hi, self.host = lo, hi, host
        self._in_use: set[int] = set()
        self._next = lo

    def allocate(self) -> int:
        size = self.hi - self.lo + 1
        for i in range(size):
            port = self.lo + (self._next - self.lo + i) % size
            if port not in self._in_use and _bindable(self.host, port):
                self._in_use.add(port)
                self._next = port + 1
                return port
        raise RuntimeError(f"no free port in {self.lo}-{self.hi} on {self.host}")

    def release(self, port: int) -> None:
        self._in_use.discard(port)

    def hold(self, ports: Iterable[int]) -> None:
        """Count ``ports`` as in use (workers started under a previous range still hold them)."""
        self._in_use.update(ports)


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True
