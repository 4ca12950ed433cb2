"""The request guard: who may send this request, and what it may spend. Called by the handler.

In the order the handler calls them:

- :meth:`RequestGuard.identify`, before the body is read: the caller's key (401), or None
  when auth is off;
- :meth:`RequestGuard.check`, once the model is known: the key's model permission (403),
  the request caps and the prompt-array bound (400);
- :meth:`RequestGuard.check_budget`, for a key with a budget: its spend (429 when it has spent
  its budget: ``gateway.spend.budgets``);
- :meth:`RequestGuard.reserve`, last, once everything that can refuse the request without
  an upstream has passed (schema, capabilities, priority header): the key's rate limits,
  tokens reserved from the request's worst case (429 with ``Retry-After`` when over). A
  refused request therefore never spends the key's budget.

Settlement (the reservation, the per-key metrics, the audit line) happens once, when the
handler closes the request's record (``gateway.accounting.RequestRecord``). The
``x-ratelimit-*`` headers are added by :meth:`RequestGuard.on_prepare`, an
``on_response_prepare`` hook registered only when some key has limits, so they are on every
answer to a known key, streams and errors included.

Cost with auth off: the handler calls none of them. What is on is decided at start-up
(``keyring``, ``store``: None when off) and the handler skips ``identify`` and ``reserve``
when they would do nothing, and checks ``caps`` (the deployment's) itself for a request
without a key: no hook, no dict work, no call that returns at once.
"""

from __future__ import annotations

from aiohttp import web

from gateway.metrics import GatewayMetrics
from gateway.security.audit import AuditLog
from gateway.security.auth import API_KEY, ApiKey, AuthenticationError, KeyRing, PermissionDeniedError, request_key
from gateway.security.caps import CapExceededError, Caps, reserve_tokens
from gateway.security.ratelimit import LimitStore, MemoryStore, RedisStore, Reservation, Verdict
from gateway.served import ServedRequest
from gateway.spend.budgets import Budget, SpendLedger, memory_spend_store, shared_spend_store
from gateway.store import MemoryStore as MemoryTenantStore
from gateway.store import TenantStore
from schemas.config import GatewayConfig
from schemas.errors import BudgetExceededError, RateLimitError

__all__ = ["RATE_HEADERS", "RequestGuard"]

_JSON = "application/json"


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
        ledger: SpendLedger | None = None,
    ) -> None:
        self._metrics = metrics
        self.caps = caps  # the deployment's caps: what a request without a key may send
        self.keyring = keyring  # None: auth is off
        self.store = store  # None: no key has rate limits
        self.audit = audit  # written when a request's record closes (None when off)
        self.ledger = ledger  # each key's spend and budget (gateway.spend.budgets); None: auth is off

    @classmethod
    def from_config(
        cls, config: GatewayConfig, metrics: GatewayMetrics, previous: RequestGuard | None = None
    ) -> RequestGuard:
        """The guard of ``config``; ``previous``: the one a reload replaces (in-memory spend carries over)."""
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
        budgets = {k.name: Budget.of(k.budget) for k in auth.keys if k.budget is not None}
        ledger = SpendLedger(budgets, _spend_counters(config, previous), on_error=metrics.spend_store_error)
        return cls(metrics=metrics, caps=caps, keyring=keyring, store=store, audit=audit, ledger=ledger)

    # --- the handler's hooks, in the order it calls them ---------------------------------------
    def identify(self, request: web.Request) -> ApiKey | None:
        """The caller's key (401 when missing or unknown); None when auth is off."""
        if self.keyring is None:
            return None
        try:
            key = request[API_KEY] = self.keyring.identify(request.headers)
        except AuthenticationError:
            self._metrics.key_rejected(None, "unauthenticated")
            raise
        return key

    def check(self, key: ApiKey | None, req: ServedRequest, model: str) -> ServedRequest:
        """May ``key`` send ``req`` to the configured ``model``? The request to serve (its caps may set
        its output limit: ``Caps.check``), or the refusal raised (403, 400)."""
        if key is None:
            return self.caps.check(req)
        try:
            KeyRing.check_model(key, model)
            return key.caps.check(req)
        except (PermissionDeniedError, CapExceededError) as exc:
            self._metrics.key_rejected(key.name, "model" if isinstance(exc, PermissionDeniedError) else "cap")
            raise

    async def check_budget(self, key: ApiKey) -> None:
        """Refuse ``key`` when it has spent its budget (429)."""
        assert self.ledger is not None
        try:
            await self.ledger.check(key.name)
        except BudgetExceededError:
            self._metrics.key_rejected(key.name, "budget")
            raise

    async def reserve(
        self, request: web.Request, key: ApiKey | None, req: ServedRequest
    ) -> tuple[Reservation | None, int]:
        """Take ``req``'s share of its key's limits (429 when over): the reservation, for the
        request's record to settle, and the prompt's estimated share of it."""
        if key is None or self.store is None or not key.limits.any:
            return None, 0
        limits = key.limits
        tokens = prompt_estimate = 0
        if limits.tpm is not None:
            prompt_estimate = req.prompt_estimate()
            tokens = reserve_tokens(req)
        verdict, reservation = await self.store.acquire(key.name, limits, tokens)
        headers = verdict.headers(limits)
        request[RATE_HEADERS] = headers
        if reservation is not None:
            return reservation, prompt_estimate
        self._metrics.key_rejected(key.name, verdict.reason or "")
        if verdict.retry_after is not None:
            headers["retry-after-ms"] = str(max(1, round(verdict.retry_after * 1000)))
        raise _refusal(key, verdict, tokens, req.output_limit_param)

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
        if self.ledger is not None:
            await self.ledger.close()


def _spend_counters(config: GatewayConfig, previous: RequestGuard | None) -> TenantStore:
    """Where the keys' spend is counted: ``auth.store`` (Redis: shared by every worker and replica),
    else this process, keeping the previous config's counters (a reload keeps what was spent)."""
    assert config.auth is not None
    url = config.auth.store_url
    if url is not None:
        return shared_spend_store(url, prefix=config.auth.store_prefix, timeout=config.auth.redis_timeout)
    old = previous.ledger.counters if previous is not None and previous.ledger is not None else None
    if isinstance(old, MemoryTenantStore):
        return old
    return memory_spend_store(len(config.auth.keys))


def _refusal(key: ApiKey, verdict: Verdict, tokens: int, limit_param: str) -> RateLimitError:
    limits = key.limits
    if verdict.reason == "too_large":
        return RateLimitError(
            f"Request too large for key '{key.name}': it may use up to {tokens} tokens (prompt estimate + "
            f"{limit_param} x n x prompts), over its limit of {limits.tpm} tokens per minute. "
            f"Lower {limit_param}, n or the prompt.",
            param=limit_param,
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
