"""The request guard: the one hook object the completion handler calls around its upstream call.

- :meth:`RequestGuard.admit`, after the model is known: the key's model permission (403),
  its cost caps and the prompt-array bound (400), then its rate limits: tokens reserved
  from the request's worst case (429 with ``Retry-After`` when over). Returns a
  :class:`Ticket`, or None when nothing needs to be settled (auth and audit off).
- :meth:`Ticket.record`, once the handler knows the backend, the final status and the
  upstream's usage.

What the handler does not see lives in the route's wrapper (:meth:`RequestGuard.completions`),
installed by ``create_app`` only when auth or the audit log is on: it identifies the key
(401) before the handler runs, and when the handler is done (a stream included) it settles
the reservation from the real usage, counts the per-key metrics and writes the audit line.
The ``x-ratelimit-*`` headers are added by :meth:`RequestGuard.on_prepare`, an
``on_response_prepare`` hook registered only when some key has limits, so they are on every
answer to a known key, streams and errors included.

Cost with auth off: ``admit`` checks the deployment caps (a few comparisons) and returns
None; no wrapper, no hook, no dict work.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.typedefs import Handler

from backends.base import TokenUsage
from gateway.metrics import GatewayMetrics
from gateway.security.audit import AuditLog
from gateway.security.auth import API_KEY, ApiKey, AuthenticationError, KeyRing, PermissionDeniedError, request_key
from gateway.security.caps import CapExceededError, Caps, reserve_tokens
from gateway.security.ratelimit import LimitStore, MemoryStore, RedisStore, Reservation, Verdict
from gateway.state import request_id_of
from schemas.completions import CompletionRequest
from schemas.config import GatewayConfig
from schemas.errors import GatewayError, RateLimitError

__all__ = ["RATE_HEADERS", "TICKET", "RequestGuard", "Ticket"]

_JSON = "application/json"


class Ticket:
    """One admitted request: what it reserved, and what the handler recorded about its end."""

    __slots__ = ("backend", "key", "model", "reservation", "status", "usage")

    def __init__(self, key: ApiKey | None, model: str, reservation: Reservation | None) -> None:
        self.key = key
        self.model = model
        self.reservation = reservation
        self.backend: str | None = None
        self.status: int | None = None
        self.usage: TokenUsage | None = None

    def record(self, backend: str, status: int, usage: TokenUsage | None) -> None:
        """The upstream answered (``status``: the request's final status, as counted in metrics)."""
        self.backend = backend
        self.status = status
        self.usage = usage

    def used_tokens(self) -> int | None:
        """Tokens to settle: real usage; all given back when no upstream answered; the
        reservation kept when one answered without reporting usage."""
        if self.usage is not None:
            return self.usage.prompt_tokens + self.usage.completion_tokens
        return 0 if self.backend is None else None


TICKET = request_key("gateway_ticket", Ticket)
RATE_HEADERS = request_key("gateway_ratelimit_headers", dict)


class RequestGuard:
    def __init__(
        self,
        *,
        metrics: GatewayMetrics,
        caps: Caps,
        keyring: KeyRing | None = None,
        store: LimitStore | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self._metrics = metrics
        self._caps = caps
        self.keyring = keyring
        self.store = store
        self._audit = audit

    @classmethod
    def from_config(cls, config: GatewayConfig, metrics: GatewayMetrics, models_body: bytes) -> RequestGuard:
        server = config.server
        caps = Caps.build(server.max_prompt_array, config.caps)
        audit = AuditLog() if server.audit_log else None
        auth = config.auth
        if auth is None:
            return cls(metrics=metrics, caps=caps, audit=audit)
        keyring = KeyRing(
            auth,
            models=(m.name for m in config.models),
            deployment_caps=config.caps,
            max_prompt_array=server.max_prompt_array,
            models_body=models_body,
        )
        store: LimitStore | None = None
        if any(key.limits.any for key in keyring.keys):
            url = auth.store_url
            store = (
                MemoryStore()
                if url is None
                else RedisStore(
                    url,
                    prefix=auth.store_prefix,
                    timeout=auth.redis_timeout,
                    retry_interval=auth.redis_retry_interval,
                    lease_seconds=auth.concurrency_lease,
                    on_degraded=metrics.ratelimit_degraded,
                    on_error=metrics.ratelimit_store_error,
                )
            )
        return cls(metrics=metrics, caps=caps, keyring=keyring, store=store, audit=audit)

    @property
    def wraps_completions(self) -> bool:
        """Whether the completion route needs :meth:`completions` (auth or audit on)."""
        return self.keyring is not None or self._audit is not None

    # --- the handler's hook -----------------------------------------------------------------
    async def admit(self, request: web.Request, req: CompletionRequest, model: str) -> Ticket | None:
        """Check and reserve for ``req`` on the configured ``model``; raise the refusal."""
        if self.keyring is None:
            self._caps.check(req)
            if self._audit is None:
                return None
            ticket = request[TICKET] = Ticket(None, model, None)
            return ticket
        key: ApiKey | None = request.get(API_KEY)
        if key is None:  # the route was registered without :meth:`completions`: fail closed
            raise AuthenticationError("Missing API key.")
        ticket = request[TICKET] = Ticket(key, model, None)
        metrics = self._metrics
        try:
            KeyRing.check_model(key, model)
            key.caps.check(req)
        except (PermissionDeniedError, CapExceededError) as exc:
            metrics.key_rejected(key.name, "model" if isinstance(exc, PermissionDeniedError) else "cost_cap")
            raise
        limits = key.limits
        if self.store is not None and limits.any:
            tokens = reserve_tokens(req) if limits.tpm is not None else 0
            verdict, ticket.reservation = await self.store.acquire(key.name, limits, tokens)
            headers = verdict.headers(limits)
            request[RATE_HEADERS] = headers
            if ticket.reservation is None:
                metrics.key_rejected(key.name, verdict.reason or "")
                if verdict.retry_after is not None:
                    headers["retry-after-ms"] = str(max(1, round(verdict.retry_after * 1000)))
                raise _refusal(key, verdict, tokens)
        return ticket

    # --- the route wrapper and hooks that create_app installs when configured ----------------
    def completions(self, handler: Handler) -> Handler:
        """``handler`` behind the key check, with settlement, per-key metrics and audit after it."""
        keyring = self.keyring
        metrics = self._metrics

        async def guarded(request: web.Request) -> web.StreamResponse:
            started = asyncio.get_running_loop().time()
            status = 500
            try:
                if keyring is not None:
                    try:
                        request[API_KEY] = keyring.identify(request.headers)
                    except AuthenticationError as exc:
                        metrics.key_rejected(None, "unauthenticated")
                        metrics.request_finished(None, None, exc.status, None)  # as other refusals before routing
                        raise
                response = await handler(request)
                status = response.status
                return response
            except GatewayError as exc:
                status = exc.status
                raise
            except asyncio.CancelledError:
                status = 499
                raise
            finally:
                self._finish(request, status, asyncio.get_running_loop().time() - started)

        return guarded

    def _finish(self, request: web.Request, status: int, latency: float) -> None:
        ticket: Ticket | None = request.get(TICKET)
        key: ApiKey | None = ticket.key if ticket is not None else request.get(API_KEY)
        usage = None
        if ticket is not None:
            status = ticket.status or status
            usage = ticket.usage
            if ticket.reservation is not None:
                ticket.reservation.store.release(ticket.reservation, ticket.used_tokens())
        if key is not None:
            self._metrics.key_request(key.name, status)
            if usage is not None:
                self._metrics.key_tokens(key.name, usage.prompt_tokens, usage.completion_tokens)
        if self._audit is not None:
            self._audit.write(
                request_id=request_id_of(request),
                key=key.name if key is not None else None,
                model=ticket.model if ticket is not None else None,
                backend=ticket.backend if ticket is not None else None,
                status=status,
                prompt_tokens=usage.prompt_tokens if usage is not None else None,
                completion_tokens=usage.completion_tokens if usage is not None else None,
                latency=latency,
            )

    async def list_models(self, request: web.Request) -> web.Response:
        """``GET /v1/models`` with auth on: only the models the caller's key may use."""
        assert self.keyring is not None
        key = request[API_KEY] = self.keyring.identify(request.headers)
        return web.Response(body=key.models_body, content_type=_JSON)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Add the ``x-ratelimit-*`` headers to every answer to a key that has limits."""
        headers: dict[str, str] | None = request.get(RATE_HEADERS)
        if headers is None:
            key: ApiKey | None = request.get(API_KEY)
            if key is None or self.store is None or not key.limits.any:
                return
            headers = (await self.store.peek(key.name, key.limits)).headers(key.limits)
        response.headers.update(headers)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()


def _refusal(key: ApiKey, verdict: Verdict, tokens: int) -> RateLimitError:
    limits = key.limits
    if verdict.reason == "too_large":
        return RateLimitError(
            f"Request too large for key '{key.name}': it may use up to {tokens} tokens (prompt estimate + "
            f"max_tokens x n x prompts), over its limit of {limits.tpm} tokens per minute. "
            "Lower max_tokens, n or the prompt.",
            param="max_tokens",
            code="rate_limit_exceeded",
        )
    what = {
        "requests": f"requests per minute (RPM): limit {limits.rpm}",
        "tokens": f"tokens per minute (TPM): limit {limits.tpm}, requested {tokens}",
        "concurrency": f"requests in flight: limit {limits.max_concurrent}",
    }.get(verdict.reason or "", "its limits")
    wait = verdict.retry_after or 0.0
    return RateLimitError(
        f"Rate limit reached for key '{key.name}' on {what}. Please try again in {wait:.3g}s.",
        code="rate_limit_exceeded",
        retry_after=verdict.retry_after,
    )
