"""What ``strategy: score`` needs from the servers besides their ``/metrics``, for one backend.

- the tokenizer (``backends.vllm.routing.tokens``), loaded once at start from ``routing.tokenizer``
  or the model the servers serve, and handed to the dispatcher;
- a hasher per server configuration (``backends.vllm.routing.blocks``: block size and hash
  algorithm from the server's ``vllm:cache_config_info``, the seed from its ``PYTHONHASHSEED``);
- the KV-event subscriptions (``backends.vllm.routing.kv_events``), re-synced by the owner whenever
  its endpoints change (:meth:`EngineSignals.sync`).

When any of them is missing (no ``tokenizers``/``pyzmq``/``msgspec``, no tokenizer file, an
unmatchable hash) the strategy scores the prefix approximately and :meth:`EngineSignals.describe`
says why (``gateway pool status``). Nothing here runs for other strategies.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from backends.vllm.routing.balancer import Endpoint
from backends.vllm.routing.blocks import BlockHasher, hasher_for
from backends.vllm.routing.dispatch import Dispatcher
from backends.vllm.routing.kv_events import KVEventFeeds
from backends.vllm.routing.tokens import load_tokenizer
from schemas.config import PoolRoutingConfig

__all__ = ["EngineSignals"]

log = logging.getLogger("gateway.pool")


class EngineSignals:
    """A backend's tokenizer, hashers and KV-event feeds (``score`` with ``prefix: kv-events`` only).

    ``address(endpoint)``: where that server publishes its events (None: nowhere known). ``seed``:
    the servers' ``PYTHONHASHSEED`` (None: unset). ``tokenizer``: where to load it from (None: unknown).
    """

    def __init__(
        self,
        name: str,
        dispatcher: Dispatcher,
        *,
        tokenizer: str | None,
        seed: str | None,
        topic: str,
        address: Callable[[Endpoint], str | None],
    ) -> None:
        self.name = name
        self._dispatcher = dispatcher
        self._address = address
        self._seed = seed
        self._hashers: dict[tuple[int, str], BlockHasher | str] = {}
        self.tokenizer_source = tokenizer
        self.problem: str | None = None
        self.feeds: KVEventFeeds | None = None
        routing = dispatcher.routing
        if not self.precise(routing):
            return
        self.feeds = KVEventFeeds(name, topic)
        self.problem = self.feeds.problem
        if self.problem is None:
            if tokenizer is None:
                self.problem = "no tokenizer: set routing.tokenizer"
            else:
                loaded = load_tokenizer(tokenizer)
                if isinstance(loaded, str):
                    self.problem = loaded
                else:
                    dispatcher.tokenizer = loaded
        if self.problem is not None:
            log.warning("backend %s: prefix scored approximately: %s", name, self.problem)
        else:
            dispatcher.balancer.hasher = self.hasher

    @staticmethod
    def precise(routing: PoolRoutingConfig) -> bool:
        return routing.strategy == "score" and routing.prefix == "kv-events"

    def hasher(self, ep: Endpoint) -> BlockHasher | None:
        load = ep.load
        if not load.prefix_caching:
            return None
        key = (load.block_size, load.hash_algo)
        found = self._hashers.get(key)
        if found is None:
            found = self._hashers[key] = hasher_for(load.block_size, load.hash_algo, self._seed)
            if isinstance(found, str) and load.block_size:
                log.warning("backend %s: prefix scored approximately: %s", self.name, found)
        return found if isinstance(found, BlockHasher) else None

    def sync(self) -> None:
        """Follow the endpoints now known: subscribe to new processes, drop gone ones."""
        if self.feeds is not None and self.problem is None:
            self.feeds.sync(self._dispatcher.endpoints, self._address)  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        """For the status: where the prefix term comes from, and why not from the events if not."""
        routing = self._dispatcher.routing
        if routing.strategy != "score":
            return {}
        problem = self.problem
        if problem is None and self.precise(routing):
            unmatched = [h for h in self._hashers.values() if isinstance(h, str)]
            problem = unmatched[0] if unmatched else None
        prefix = "kv-events" if self.precise(routing) and problem is None else "approximate"
        modes = self._dispatcher.balancer.prefix_modes
        return {
            "prefix": prefix,
            "why": problem if self.precise(routing) else None,
            "tokenizer": self.tokenizer_source if self._dispatcher.tokenizer is not None else None,
            "scored_kv_events": modes.get("kv_events", 0),
            "scored_approximate": modes.get("approximate", 0),
        }

    async def close(self) -> None:
        if self.feeds is not None:
            await self.feeds.close()
