"""Local vLLM worker pools: workers this gateway starts and supervises (``type: vllm-pool``).

:class:`VLLMPoolBackend` plans, spawns, probes, restarts and stops vLLM processes
(``supervisor``, ``worker``, ``process``, ``launcher``, ``resources``, ``probe``) and rolls a
changed section out (``rollout``); it routes over its workers with ``backends.vllm.routing``,
as multi-server ``vllm`` does. ``client`` and ``shared``: both kinds as the processes of
``gateway serve --workers N`` share them.
"""

from backends.vllm.pool.pool import VLLMPoolBackend, pool_log_dir

__all__ = ["VLLMPoolBackend", "pool_log_dir"]
