"""The seam between ``POST /v1/responses`` and the conversation store: what the handler needs, nothing more.

The Responses handler calls a :class:`ResponsesState` at two points, and only there:

1. before routing, when the request names ``previous_response_id``: :meth:`ResponsesState.history`
   gives the earlier turns' items, which the gateway sends upstream ahead of the request's own
   ``input`` (whichever backend served the earlier turns: the state lives here, never upstream);
2. once the response reached a terminal status (``completed``, ``incomplete``, ``failed``, or
   ``cancelled`` for a client that left mid-stream), when the request had ``store`` true or unset
   (OpenAI's default): :meth:`ResponsesState.save` with a :class:`FinishedTurn`.

Contract (what an implementation guarantees, and may rely on):

- ``tenant`` is the caller's key name, or :data:`NO_AUTH_TENANT` when auth is off (one tenant).
  State saved under one tenant is invisible to every other: ``history`` of another tenant's id
  raises the same 404 as an id that never existed, so ids leak nothing.
- ``history(tenant, id)`` returns the conversation that led to ``id`` and ``id`` itself: for the
  chain A <- B <- id, A's input items, A's output items, B's input, B's output, id's input, id's
  output, oldest first, each a plain JSON object as the client sent it / got it (``instructions``
  are never items: OpenAI does not carry them over). Unknown, expired or evicted: raise
  :func:`unknown_response` (404 ``param: previous_response_id``).
- ``save`` is called once per stored turn, just *before* the client has its answer (a
  non-stream's body, a stream's terminal event), or as soon as a client that left mid-stream is
  known to be gone: a client (an agent loop) continues the moment it has the answer, possibly on
  another worker, and must find the turn stored. It never raises (a store that failed or a turn
  over the bounds is logged and counted instead) and is quick (one store write): it runs on the
  request's task. ``turn.input_items`` are the request's own items only (never the expanded
  history), each with an ``id``.
- Everything is JSON-safe data (``dict``/``list``/``str``/numbers), so a Redis implementation
  stores it as it comes.

:class:`gateway.conversations.ConversationStore` is the implementation a running gateway uses
(``GatewayState.responses_state``: memory bounded by count, bytes and TTL, or Redis for ``--workers``
and replicas; it also serves ``GET``/``DELETE /v1/responses/{id}``). :class:`MemoryResponsesState`
is the trivial in-process one (bounded by count, oldest evicted first), for tests of the seam.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.store.base import ANONYMOUS
from schemas.errors import NotFoundError

__all__ = ["NO_AUTH_TENANT", "FinishedTurn", "MemoryResponsesState", "ResponsesState", "unknown_response"]

NO_AUTH_TENANT = ANONYMOUS  # auth off: every caller is the same tenant


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs ~5K instructions more, on every stored turn)
class FinishedTurn:
    """One turn to keep: the Response object as the client got it (its final form), and its inputs.
    A value: made by the handler's hooks, read (never changed) by the store."""

    response: dict[str, Any]  # ``id``, ``status`` (terminal), ``output``, ``usage``, ``instructions``, ...
    input_items: list[dict[str, Any]]  # this request's own input, as items with ids
    previous_response_id: str | None  # the turn it continues, if any
    dumped: bytes | None = None  # ``orjson.dumps(response)``, where it was made so (records.encode's ``dumped``)
    output_at: int = 0  # where ``dumped``'s output and usage keys start (encode's ``output_at``)


class ResponsesState(Protocol):
    """Conversation state for ``previous_response_id`` and ``store`` (module docstring: the contract)."""

    async def history(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        """Every item of the conversation through ``response_id``, oldest first; 404 when unknown."""

    async def turns(self, tenant: str, response_id: str) -> list[list[dict[str, Any]]]:
        """:meth:`history` cut into turns (each turn's input items, then its output items), oldest
        first: what ``truncation: auto`` drops whole."""

    async def save(self, tenant: str, turn: FinishedTurn) -> None:
        """Keep a turn that reached a terminal status (``store`` true); evicts rather than fails."""

    def check_storable(self) -> None:
        """Before any upstream call of a request with ``store`` true: raise the 400 naming ``store``
        when it cannot be honoured (memory state in several ``--workers`` processes)."""


def unknown_response(response_id: str) -> NotFoundError:
    """The one answer for an id this tenant cannot see (never existed, expired, another key's)."""
    return NotFoundError(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


class MemoryResponsesState:
    """The trivial in-process state: at most ``max_responses`` turns, oldest evicted first.

    Each entry keeps the turn's own items and its predecessor's id; :meth:`history` walks the
    chain (a turn whose predecessor was evicted starts the conversation there).
    """

    def __init__(self, max_responses: int = 1000) -> None:
        self._max = max_responses
        self._turns: OrderedDict[tuple[str, str], FinishedTurn] = OrderedDict()

    async def history(self, tenant: str, response_id: str) -> list[dict[str, Any]]:
        return [item for turn in await self.turns(tenant, response_id) for item in turn]

    async def turns(self, tenant: str, response_id: str) -> list[list[dict[str, Any]]]:
        turn = self._turns.get((tenant, response_id))
        if turn is None:
            raise unknown_response(response_id)
        chain: list[FinishedTurn] = []
        seen: set[str] = set()
        while turn is not None and turn.response.get("id") not in seen:
            seen.add(turn.response.get("id", ""))
            chain.append(turn)
            previous = turn.previous_response_id
            turn = self._turns.get((tenant, previous)) if previous is not None else None
        return [[*earlier.input_items, *(earlier.response.get("output") or ())] for earlier in reversed(chain)]

    def check_storable(self) -> None:
        return None

    async def save(self, tenant: str, turn: FinishedTurn) -> None:
        key = (tenant, str(turn.response["id"]))
        self._turns[key] = turn
        self._turns.move_to_end(key)
        while len(self._turns) > self._max:
            self._turns.popitem(last=False)
