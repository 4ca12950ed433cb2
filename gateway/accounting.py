"""One request's record (either endpoint): opened by the handler, closed exactly once in its ``finally``.

The handler (``gateway.http.handlers.serve``) opens a :class:`RequestRecord` before it
reads the body, so every answer of the completion route is in it: a 401, a 408 or 413 from
the body limits, a 400/403/404/429 refusal, an upstream error, a stream cut midway, a client
that left (499) or the drain deadline (503). Along the way the handler, the request guard and
the service fill in what they learn (model, key, reservation, backend, usage, what was
relayed); :meth:`RequestRecord.close` then carries it, once, to:

- the metrics: ``gateway_requests_total`` with the real status, latency, tokens, disconnects,
  the answering attempt's upstream duration and a stream's time per output token;
- the key's rate-limit reservation: settled by :meth:`RequestRecord.used_tokens`;
- spend (``gateway_cost_total``, the key's budget): what :meth:`RequestRecord.billed_usage` costs at
  the answering route's price, which the request took when it was routed (a reload's new prices
  apply to the requests routed after it);
- the per-key metrics and the audit line (with the request's cost).

When a request is finished: once the gateway has handed the last byte of its answer to the
connection (a stream's ``[DONE]``, after its last event or its error event: :meth:`RequestRecord.answered`).
From then on it is counted with that answer's status and tokens whatever the client does with
the connection next: a client that closes its socket the moment it has read ``[DONE]`` cancels
the handler while the gateway is still releasing the upstream, and that is no disconnect. A
non-streamed answer is handed to aiohttp whole when the handler returns, and counted then.
Spend and budgets built on these counts read :attr:`RequestRecord.final` (None: not finished).

Token settlement follows what the upstream did, the same way for streams and non-streams:
its usage when it reported one; nothing when no upstream worked on the request; otherwise an
estimate from what was relayed (the prompt plus one token per relayed event). A non-stream
answer relays nothing until it is complete, so a client that leaves while the upstream is
generating has no relayed part to count: its reservation stands (it was the bound the key
agreed to), instead of being refunded for work the upstream did. Spend follows the same rule
(:meth:`RequestRecord.billed_usage`), labelled ``source="estimate"`` whenever it is not the
upstream's own usage.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from backends.base import Backend, TokenUsage
from gateway.metrics import GatewayMetrics
from gateway.security.audit import AuditLog
from gateway.security.auth import ApiKey
from gateway.security.ratelimit import Reservation
from gateway.served import ServedRequest
from gateway.spend.prices import Price
from schemas.endpoints import Endpoint

if TYPE_CHECKING:
    from gateway.spend.budgets import SpendLedger
    from gateway.tracing import RequestTrace

__all__ = ["RequestRecord"]


class Route(Protocol):
    """What the record reads of the route an attempt went to (``gateway.flow.router.Route``)."""

    @property
    def backend(self) -> Backend: ...
    @property
    def price(self) -> Price | None: ...


class RequestRecord:
    """What one request was, did and cost. One per request; not shared."""

    __slots__ = (
        "_audit", "_closed", "_metrics", "backend", "cost", "endpoint", "error", "final", "first_at", "key",
        "ledger", "model", "prompt_estimate", "reached", "relayed", "request", "request_id", "reservation",
        "route", "started", "status", "trace", "upstream_ended", "upstream_started", "usage", "user",
    )  # fmt: skip

    def __init__(
        self,
        metrics: GatewayMetrics,
        audit: AuditLog | None,
        request_id: str,
        endpoint: Endpoint = Endpoint.COMPLETIONS,
    ) -> None:
        self._metrics = metrics
        self.endpoint = endpoint  # the API the request came in on: every series and the audit line say it
        self._audit = audit
        self._closed = False
        self.request_id = request_id
        self.started = asyncio.get_running_loop().time()
        self.model: str | None = None  # the configured model, once looked up
        self.key: ApiKey | None = None  # the caller's key, when auth is on
        self.reservation: Reservation | None = None  # what the key's limits reserved
        self.prompt_estimate = 0  # the prompt's share of the reservation
        # Set by the service while an attempt is with an upstream (and kept when it answers):
        # the client that leaves then has had work done for it.
        self.reached = False
        self.route: Route | None = None  # that attempt's route (its price is the request's)
        # Monotonic times: the answering attempt's start and its last byte read, a stream's first event.
        self.upstream_started: float | None = None
        self.upstream_ended: float | None = None
        self.first_at: float | None = None
        self.request: ServedRequest | None = None  # the validated request, once parsed
        self.ledger: SpendLedger | None = None  # where the key's spend is counted (auth on)
        self.cost: int | None = None  # what the request cost (gateway.spend.prices.UNIT), once closed
        self.backend: str | None = None  # the backend that answered, or whose failure is the answer
        self.usage: TokenUsage | None = None  # as the upstream reported it
        self.relayed: int | None = None  # stream events sent to the client (None: not streaming yet)
        # A stream's final status when it differs from its 200 head (an error event midway).
        self.status: int | None = None
        # The status of an answer whose last byte was written (:meth:`answered`): the request is finished.
        self.final: int | None = None
        # The request's ``user`` (OpenAI's end-user id), for the audit line only: client-supplied,
        # so never a metric label. Kept raw here; the audit log bounds and escapes it.
        self.user: str | None = None
        self.trace: RequestTrace | None = None  # the request's trace when tracing is on (gateway.tracing)
        self.error: BaseException | None = None  # the error the client got, if any (the trace's error.type)

    def answered(self) -> None:
        """The answer's last byte is written: the request is finished with its status (``status``, else 200).

        :meth:`close` then counts that status, not the 499 of a client that leaves afterwards.
        """
        self.final = self.status or 200

    def used_tokens(self) -> int | None:
        """Tokens to settle the key's reservation with; None keeps what was reserved."""
        usage = self.usage
        if usage is not None:
            return usage.prompt_tokens + usage.completion_tokens
        if not self.reached:
            return 0  # no upstream worked on it: all of it goes back
        if self.relayed is not None:
            return self.prompt_estimate + self.relayed
        return None

    def billed_usage(self) -> tuple[TokenUsage, bool] | None:
        """The usage the request is charged for, and whether it is the gateway's estimate; None: nothing.

        The upstream's usage when it reported one; nothing when no upstream worked on it; else an
        estimate as :meth:`used_tokens` settles: the prompt estimate plus one token per relayed event,
        or for an answer never relayed (a non-stream whose client left) its reservation's bound.
        """
        usage = self.usage
        if usage is not None:
            return usage, False
        request = self.request
        if not self.reached or request is None:
            return None
        prompt = self.prompt_estimate or request.prompt_estimate()
        if self.relayed is not None:
            return TokenUsage(prompt, self.relayed), True
        return TokenUsage(prompt, request.output_limit * request.sequences * request.prompt_count), True

    def close(self, status: int) -> None:
        """Account for the request's answer (``status``, as the client saw it; a finished answer's own
        status when :meth:`answered` was called); idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.final is not None:
            status = self.final
        seconds = asyncio.get_running_loop().time() - self.started
        metrics, model, backend, usage, endpoint = self._metrics, self.model, self.backend, self.usage, self.endpoint
        upstream = per_token = None
        ended = self.upstream_ended
        if ended is not None and self.upstream_started is not None:
            upstream = ended - self.upstream_started
            first = self.first_at
            if first is not None and usage is not None and ended > first and self.request is not None:
                after_first = usage.completion_tokens // self.request.sequences - 1
                if after_first > 0:
                    per_token = (ended - first) / after_first
        metrics.request_closed(model, backend, status, seconds, usage, endpoint, upstream, per_token)
        if self.reservation is not None:
            self.reservation.store.release(self.reservation, self.used_tokens())
        key = self.key
        route = self.route
        if route is not None:
            price = route.price
            if price is not None:  # what the request cost: the cost counter, the key's spend
                billed = (usage, False) if usage is not None else self.billed_usage()
                if billed is not None:
                    amount = self.cost = price.cost(billed[0])
                    name = key.name if key is not None else None
                    metrics.spent(model, route.backend.name, name, amount, billed[1])
                    if self.ledger is not None and name is not None:
                        self.ledger.charge(name, amount)
        if key is not None:
            metrics.key_request(key.name, status)
            if usage is not None:
                metrics.key_tokens(key.name, usage.prompt_tokens, usage.completion_tokens)
        trace = self.trace
        if trace is not None:  # sampled or not: ending it also breaks its request <-> attempt cycle
            trace.end(status, usage, self.error)
        if self._audit is not None:
            self._audit.write(
                request_id=self.request_id,
                key=key.name if key is not None else None,
                model=model,
                backend=backend,
                status=status,
                prompt_tokens=usage.prompt_tokens if usage is not None else None,
                completion_tokens=usage.completion_tokens if usage is not None else None,
                latency=seconds,
                endpoint=endpoint.value,
                user=self.user,
                trace=trace.ids if trace is not None else None,
                cost=self.cost,
                cached_tokens=usage.cached_tokens if usage is not None else None,
            )
