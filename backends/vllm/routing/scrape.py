"""Reading the few numbers we need from a vLLM server's Prometheus ``/metrics`` text.

- ``vllm:num_requests_waiting``, ``vllm:num_requests_running``: summed over label sets
  (one per engine / model);
- ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before vLLM 0.10): the
  fraction (0..1, despite the name) of KV-cache blocks in use; the largest over label sets;
- ``vllm:cache_config_info``: an info gauge whose labels are the cache config; we keep
  ``block_size``, ``num_gpu_blocks``, ``enable_prefix_caching`` and ``prefix_caching_hash_algo``
  (what ``backends.vllm.routing.blocks`` needs to hash a prompt as the server does).

Anything unparseable is skipped: a scrape never fails a worker. A scrape that got no answer
is :meth:`WorkerLoad.failed`: the last figures stay (for the status) but are marked stale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

__all__ = ["WorkerLoad", "parse_vllm_metrics"]

_WAITING = "vllm:num_requests_waiting"
_RUNNING = "vllm:num_requests_running"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_CACHE_INFO = "vllm:cache_config_info"
_NAMES = (_WAITING, _RUNNING, *_KV, _CACHE_INFO)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """A server's load as its last scrape said, and what the gateway had in flight there then.

    ``stale``: the last scrape failed (or none happened yet); routing then scores the server by the
    gateway's own in-flight count. ``in_flight``: the gateway's calls in flight to the server when
    the scrape's answer came, so a later reader can add what it sent (or finished) since.
    """

    waiting: float = 0.0
    running: float = 0.0
    kv_cache_usage: float = 0.0
    block_size: int = 0
    num_gpu_blocks: int = 0
    prefix_caching: bool = True
    hash_algo: str = ""
    in_flight: int = 0
    stale: bool = True

    def failed(self) -> WorkerLoad:
        return self if self.stale else replace(self, stale=True)

    def at(self, in_flight: int) -> WorkerLoad:
        return replace(self, in_flight=in_flight)


def parse_vllm_metrics(text: str, in_flight: int = 0) -> WorkerLoad:
    """The figures routing reads. vLLM's ``/metrics`` is ~50 KB of histograms: each of our few names
    is looked for with ``str.find`` (memchr speed), not line by line."""
    waiting = running = kv = 0.0
    info: dict[str, str] = {}
    for name, labels, raw in _samples(text):
        if name == _CACHE_INFO:
            info = dict(_LABEL.findall(labels))
            continue
        try:
            value = float(raw)
        except ValueError:
            continue
        if value != value or value < 0:  # NaN or nonsense
            continue
        if name == _WAITING:
            waiting += value
        elif name == _RUNNING:
            running += value
        else:
            kv = max(kv, min(value, 1.0))
    return WorkerLoad(
        waiting,
        running,
        kv,
        block_size=_int(info.get("block_size")),
        num_gpu_blocks=_int(info.get("num_gpu_blocks")),
        prefix_caching=info.get("enable_prefix_caching", "True") != "False",
        hash_algo=info.get("prefix_caching_hash_algo", "")[:32],
        in_flight=in_flight,
        stale=False,
    )


def _int(value: str | None) -> int:
    try:
        return max(0, int(value)) if value is not None else 0
    except ValueError:
        return 0


def _samples(text: str) -> list[tuple[str, str, str]]:
    """(name, labels, value) of every sample of our names; a longer name (``..._by_reason``) is not ours."""
    text = "\n" + text
    out = []
    for name in _NAMES:
        needle = "\n" + name
        i = text.find(needle)
        while i != -1:
            start = i + len(needle)
            end = text.find("\n", start)
            line = text[start:] if end == -1 else text[start:end]
            labels = ""
            if line.startswith("{"):
                close = line.rfind("}")
                labels, line = line[1:close], line[close + 1 :]
            if line[:1] in (" ", "\t"):
                parts = line.split()
                if parts:
                    out.append((name, labels, parts[0]))
            i = -1 if end == -1 else text.find(needle, end)
    return out
