"""Routing over a set of vLLM servers, reading the servers themselves: used by ``vllm-pool`` and
multi-server ``vllm`` alike, apart from process supervision (``backends.vllm.pool``).

- ``balancer``: the choice of server (least load, prefix affinity, prefix hash); ``prefix``: the
  prompt's prefix keys; ``scrape``: what a server's ``/metrics`` says about its load;
- ``dispatch``: one call over the servers (pick, send, retry on another); ``inflight``: the
  gateway's calls in flight per server, shared by the processes of ``--workers N``;
- ``remote``: :class:`VLLMEndpointsBackend` (``type: vllm`` with ``base_urls`` or ``discovery``):
  servers someone else runs, found, probed and scraped here;
- ``status``, ``metrics``: what a routed set of servers reports (``gateway pool status``, ``/metrics``).
"""

from backends.vllm.routing.dispatch import NoReadyWorkerError
from backends.vllm.routing.remote import VLLMEndpointsBackend
from backends.vllm.routing.status import STATES, PoolStatus, ReportsPool, WorkerStatus

__all__ = ["STATES", "NoReadyWorkerError", "PoolStatus", "ReportsPool", "VLLMEndpointsBackend", "WorkerStatus"]
