"""Local vLLM worker pools and multi-server vLLM backends.

- :class:`VLLMPoolBackend` (``type: vllm-pool``): workers this gateway starts and supervises
  (``supervisor``, ``process``, ``launcher``);
- :class:`VLLMEndpointsBackend` (``type: vllm`` with ``base_urls`` or ``discovery``): servers
  someone else runs;

both routing with the same ``balancer`` (load + prefix affinity) and ``dispatch`` (retries
across workers). ``status`` is what they report (``gateway pool status``, metrics).
"""

from backends.vllm.pool.dispatch import NoReadyWorkerError
from backends.vllm.pool.pool import VLLMPoolBackend, pool_log_dir
from backends.vllm.pool.remote import VLLMEndpointsBackend
from backends.vllm.pool.status import STATES, PoolStatus, ReportsPool, WorkerStatus

__all__ = [
    "STATES",
    "NoReadyWorkerError",
    "PoolStatus",
    "ReportsPool",
    "VLLMEndpointsBackend",
    "VLLMPoolBackend",
    "WorkerStatus",
    "pool_log_dir",
]
