"""Reading the few numbers we need from a vLLM server's Prometheus ``/metrics`` text.

- ``vllm:num_requests_waiting``, ``vllm:num_requests_running``: summed over label sets
  (one per engine / model);
- ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before vLLM 0.10): the
  fraction (0..1, despite the name) of KV-cache blocks in use; the largest over label sets.

Anything unparseable is skipped: a scrape never fails a worker.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WorkerLoad", "parse_vllm_metrics"]

_WAITING = "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_NAMES = frozenset((_WAITING, _RUNNING, *_KV))


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0


def parse_vllm_metrics(text: str) -> WorkerLoad:
    waiting = running = kv = 0.0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        brace, space = line.find("{"), line.find(" ")
        labelled = brace != -1 and (space == -1 or brace < space)
        name = line[:brace] if labelled else line[:space]
        if name not in _NAMES:
            continue
        rest = line[line.rfind("}") + 1 :] if labelled else line[space:]
        try:
            value = float(rest.split()[0])
        except (IndexError, ValueError):
            continue
        if value != value or value < 0:  # NaN or nonsense
            continue
        if name == _WAITING:
            waiting += value
        elif name == _RUNNING:
            running += value
        else:
            kv = max(kv, min(value, 1.0))
    return WorkerLoad(waiting, running, kv)
