"""The conversations ``store: true`` keeps: saved when a response ends, read by id, continued by
``previous_response_id``, deleted; each visible to its tenant alone (see :mod:`gateway.store`).
:class:`ConversationStore` implements the Responses handler's seam,
:class:`gateway.responses_state.ResponsesState`, and serves the stored-response endpoints.

Errors are the answers clients see: an id that does not exist, belongs to another tenant, was
deleted, expired or evicted is the same 404 (the answer never tells them apart), and a store
whose processes would not share conversations (memory with ``--workers`` N > 1) refuses by name
whatever needs one.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gateway.conversations.records import Record, Turn, decode, encode, named, turn_of
from gateway.metrics import GatewayMetrics
from gateway.responses_state import FinishedTurn, unknown_response
from gateway.store import MemoryStore, RedisStore, StoreUnavailableError, TenantStore
from schemas.config import ResponsesConfig
from schemas.errors import InvalidRequestError, NotFoundError

__all__ = ["NAMESPACE", "Conversation", "ConversationStore", "not_found"]

log = logging.getLogger("gateway.conversations")

NAMESPACE = "responses"
_CHAINS = 4096  # chains remembered between a request's history() and its save() (saves a store read)
# A full memory store evicts 1/64 of its bounds ahead (MemoryStore's ``ahead``): once every
# max_items/64 turns, not on every stored turn, at the cost of keeping up to 1.6 % fewer of them.
_EVICT_AHEAD = 1


@dataclass(frozen=True, slots=True)
class Conversation:
    """The earlier turns ``previous_response_id`` names, oldest first (empty: a first turn)."""

    turns: list[Turn] = field(default_factory=list)

    @property
    def chain(self) -> list[str]:
        """The ids of the turns, oldest first: a response continuing them keeps this as its chain."""
        return [turn.response_id for turn in self.turns]

    def items(self) -> list[dict[str, Any]]:
        """Every earlier input and output item in order: what goes upstream before the new input."""
        return [item for turn in self.turns for item in turn.items]


def _unkept(response_id: str, exc: TypeError) -> None:
    """A turn whose record JSON cannot hold (orjson: an integer past 64 bits, say; the answer itself
    was exact): logged, not stored."""
    log.error("response %s was not stored: %s", response_id, exc)


def not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"Response with id '{response_id}' not found.", param="response_id", code="not_found")


def _previous_not_found(response_id: str, missing: str) -> NotFoundError:
    if missing == response_id:
        return unknown_response(response_id)
    # An earlier turn is gone: continuing without it would silently drop part of the conversation.
    return NotFoundError(
        f"Previous response with id '{response_id}' cannot be continued: response '{missing}' earlier in its "
        "conversation is no longer stored (deleted, expired or evicted). Send the conversation as input instead.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


class ConversationStore:
    """Stored responses of every tenant, over one :class:`~gateway.store.TenantStore`.

    ``unshared``: the number of worker processes that would each hold their own memory store
    (0: the store is shared or there is one process); then every call that needs the store
    raises a 400 naming ``store`` (or the field that needs it) instead of splitting conversations.
    """

    def __init__(self, store: TenantStore | None, *, unshared: int = 0) -> None:
        self.store = store
        self.unshared = unshared
        self._chains: OrderedDict[tuple[str, str], list[str]] = OrderedDict()

    @classmethod
    def from_config(cls, config: ResponsesConfig, metrics: GatewayMetrics, *, workers: int = 1) -> ConversationStore:
        """The store ``responses:`` describes, for a gateway of ``workers`` processes."""
        url = config.store_url
        if url is not None:
            redis = RedisStore(
                url,
                NAMESPACE,
                ttl=config.ttl,
                prefix=config.store_prefix,
                timeout=config.redis_timeout,
                on_error=lambda: metrics.store_error(NAMESPACE),
            )
            return cls(redis)
        if workers > 1:
            return cls(None, unshared=workers)
        memory = MemoryStore(
            NAMESPACE,
            ttl=config.ttl,
            max_items=config.max_items,
            max_bytes=config.max_bytes,
            # (a partial: no frame of its own)
            on_evict=functools.partial(metrics.store_evicted, NAMESPACE),
            ahead=_EVICT_AHEAD,
        )
        metrics.watch_store(NAMESPACE, memory.stats)
        return cls(memory)

    def configure(self, config: ResponsesConfig) -> None:
        """A reload's new ``ttl`` and bounds (the store itself, memory or Redis, is kept)."""
        store = self.store
        if isinstance(store, MemoryStore):
            store.configure(ttl=config.ttl, max_items=config.max_items, max_bytes=config.max_bytes)
        elif store is not None:
            store.ttl = config.ttl

    def _backing(self, param: str) -> TenantStore:
        if self.store is None or self.unshared:
            raise InvalidRequestError(
                f"This gateway runs {self.unshared} worker processes that keep stored responses in memory, which "
                "they do not share, so it cannot keep or continue conversations. Send 'store': false without "
                "'previous_response_id', or have the operator set responses.store to a Redis URL.",
                param=param,
                code="store_not_shared",
            )
        return self.store

    async def conversation(self, tenant: str, previous_response_id: str) -> Conversation:
        """The turns ``previous_response_id`` continues (its chain, then itself), touched so that a
        conversation in use is the last to expire or be evicted; 404 when any of them is gone."""
        store = self._backing("previous_response_id")
        (head,) = await store.get(tenant, [previous_response_id], touch=True)
        if head is None:
            raise _previous_not_found(previous_response_id, previous_response_id)
        record = decode(head)
        chain = record.chain
        blobs = await store.get(tenant, chain, touch=True) if chain else []
        turns: list[Turn] = []
        for earlier, blob in zip(chain, blobs, strict=True):
            if blob is None:
                raise _previous_not_found(previous_response_id, earlier)
            turns.append(turn_of(earlier, blob))
        turns.append(record.turn(previous_response_id))
        self._remember(tenant, previous_response_id, [*chain, previous_response_id])
        return Conversation(turns)

    def check_storable(self) -> None:
        """Refuse ``store: true`` up front when it could not be honoured (before any upstream call)."""
        if self.store is None or self.unshared:  # (_backing's test: this runs on every stored turn)
            self._backing("store")

    # --- the Responses handler's seam (gateway.responses_state.ResponsesState) ------------------
    async def history(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        return (await self.conversation(tenant, response_id)).items()

    async def turns(self, tenant: str, response_id: str) -> list[list[dict[str, Any]]]:
        # (Turn.items, inline: a call per turn of every continuation)
        return [turn.input + turn.output for turn in (await self.conversation(tenant, response_id)).turns]

    async def save(self, tenant: str, turn: FinishedTurn) -> None:
        """Keep a turn after the one it continues; never raises (a store that failed or a turn over
        the byte bound leaves it unstored: logged, and counted in the store's metrics)."""
        response, previous, dumped, output_at = turn.response, turn.previous_response_id, turn.dumped, turn.output_at
        items = named(turn.input_items)
        if self.save_now(tenant, response, items, previous, dumped, output_at):
            return
        response_id = str(response["id"])
        try:
            store = self._backing("store")
            chain = await self._chain(store, tenant, previous) if previous is not None else []
            record = self._record(response_id, response, items, chain, dumped, output_at)
            # (a memory store whose chain had to be read comes here too: its byte bound refuses as save_now's)
            if record is not None and not await store.put(tenant, response_id, record):
                log.warning("response %s was not stored: larger than responses.max_bytes", response_id)
        except (StoreUnavailableError, InvalidRequestError) as exc:
            log.error("response %s was not stored: %s", response_id, exc.message)

    def save_now(
        self, tenant: str, response: dict[str, Any], items: list[dict[str, Any]] | bytes, previous: str | None,
        dumped: bytes | None, output_at: int = 0,
    ) -> bool:  # fmt: skip
        """:meth:`save` of a :class:`FinishedTurn`'s fields, without awaiting, where nothing is to
        be awaited (a memory store, and a first turn or a continuation whose chain :meth:`history`
        just loaded): what the handler's hooks call on every stored turn, without a turn object or a
        coroutine. ``items``: each with its ``id`` (``own_items``'s), or their line already written
        (``records.text_input_line``); ``output_at``: encode's. False when there is something to await
        (then :meth:`save` keeps it)."""
        store = self.store
        if type(store) is not MemoryStore or self.unshared:
            return False
        if previous is None:
            chain: list[str] = []
        else:
            remembered = self._chains.pop((tenant, previous), None)
            if remembered is None:
                return False
            chain = remembered
        response_id = str(response["id"])
        if chain:
            record = self._record(response_id, response, items, chain, dumped, output_at)
        else:  # a first turn (the usual): _record less its chain's test, without its call
            try:
                record = encode(response, items, chain, dumped, output_at)
            except TypeError as exc:
                _unkept(response_id, exc)
                return True
        if record is not None and not store.put_now(tenant, response_id, record):
            log.warning("response %s was not stored: larger than responses.max_bytes", response_id)
        return True

    @staticmethod
    def _record(
        response_id: str, response: dict[str, Any], items: list[dict[str, Any]] | bytes, chain: list[str],
        dumped: bytes | None, output_at: int,
    ) -> bytes | None:  # fmt: skip
        """The turn's record (:func:`~gateway.conversations.records.encode`); None, logged, when it cannot be kept."""
        if response_id in chain:  # an upstream that reuses ids: storing it would loop the conversation
            log.error("response %s was not stored: its conversation already holds that id", response_id)
            return None
        try:
            return encode(response, items, chain, dumped, output_at)
        except TypeError as exc:
            _unkept(response_id, exc)
            return None

    async def _chain(self, store: TenantStore, tenant: str, previous: str) -> list[str]:
        """The chain a turn continuing ``previous`` keeps: the one ``history`` just loaded, or read."""
        chain = self._chains.pop((tenant, previous), None)
        if chain is not None:
            return chain
        (blob,) = await store.get(tenant, [previous])
        return [*decode(blob).chain, previous] if blob is not None else [previous]

    def _remember(self, tenant: str, response_id: str, chain: list[str]) -> None:
        self._chains[(tenant, response_id)] = chain
        if len(self._chains) > _CHAINS:
            self._chains.popitem(last=False)

    async def get(self, tenant: str, response_id: str) -> Record:
        """The stored response (404 when absent for this tenant)."""
        (blob,) = await self._backing("response_id").get(tenant, [response_id])
        if blob is None:
            raise not_found(response_id)
        return decode(blob)

    async def delete(self, tenant: str, response_id: str) -> None:
        if not await self._backing("response_id").delete(tenant, response_id):
            raise not_found(response_id)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
