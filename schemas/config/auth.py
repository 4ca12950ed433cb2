"""API keys, per-key limits and request caps (used by ``gateway.security``)."""

from __future__ import annotations

import hashlib
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from schemas.config.common import Name, _Strict, unique_name
from schemas.config.pricing import BudgetConfig

# --- security and tenancy (gateway.security: auth, ratelimit, caps) ------------------------------
Sha256Hex = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]
_STORE_SCHEMES = ("redis://", "rediss://", "unix://")
_MIN_SECRET = 16


class RequestCaps(_Strict):
    """The largest request a caller may send (null = no cap); a refusal names the field and the cap.

    Deployment-wide as ``caps:``, per key as ``auth.keys[].caps``; the lower of the two wins.
    """

    n: Annotated[int, Field(ge=1)] | None = None
    best_of: Annotated[int, Field(ge=1)] | None = None
    # The output limit (max_tokens, chat's max_completion_tokens, Responses' max_output_tokens).
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    # A request that leaves its output limit unset (the openai SDK and LangChain send none): "apply"
    # sends it with max_tokens as its limit; "refuse" answers 400 naming the field. Unset on a key:
    # the deployment's choice.
    on_missing: Literal["apply", "refuse"] = "apply"
    # Prompts in one request (a batch of N prompts counts N).
    prompts: Annotated[int, Field(ge=1)] | None = None
    # Prompt (estimated) + max_tokens x max(n, best_of) x prompts.
    total_tokens: Annotated[int, Field(ge=1)] | None = None


def memory_or_redis(value: SecretStr) -> SecretStr:
    """A store setting: ``memory`` or a Redis URL (``auth.store``, ``responses.store``)."""
    text = value.get_secret_value()
    if text != "memory" and not text.startswith(_STORE_SCHEMES):
        # The value itself is never echoed: it may hold a password.
        raise ValueError("must be 'memory' or a redis://, rediss:// or unix:// URL")
    return value


def _sha256_of(secret: SecretStr | None, digest: str | None) -> str:
    if secret is not None:
        return hashlib.sha256(secret.get_secret_value().encode()).hexdigest()
    return (digest or "").lower()


def _strong(value: SecretStr | None) -> SecretStr | None:
    if value is not None and len(value.get_secret_value()) < _MIN_SECRET:
        raise ValueError(f"must be at least {_MIN_SECRET} characters (a guessable key is no key)")
    return value


class ApiKeyConfig(_Strict):
    """One caller. The secret is given as ``key`` (normally ``${ENV}``) or as its SHA-256 hex digest."""

    name: Name
    key: SecretStr | None = None
    key_sha256: Sha256Hex | None = None
    # Model names or globs (``gpt-*``, ``*``) this key may use; others answer 403 and are
    # not listed in its GET /v1/models.
    models: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: ["*"]
    )
    # Token buckets (null = unlimited): requests and tokens per minute, and requests in flight.
    rpm: Annotated[int, Field(ge=1)] | None = None
    tpm: Annotated[int, Field(ge=1)] | None = None
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    caps: RequestCaps = Field(default_factory=RequestCaps)
    # The most this key may spend, in the currency of ``models[].pricing`` (null = no budget).
    budget: BudgetConfig | None = None

    @field_validator("key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return _strong(value)

    @model_validator(mode="after")
    def _one_secret(self) -> ApiKeyConfig:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("give exactly one of key, key_sha256")
        return self

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the secret (lowercase)."""
        return _sha256_of(self.key, self.key_sha256)


class AuthConfig(_Strict):
    """API keys, per-key limits, and where the limits' counters live. Absent = auth off."""

    keys: Annotated[list[ApiKeyConfig], Field(min_length=1)]
    # A key for GET /metrics alone (null = /metrics stays open, e.g. on a private port).
    metrics_key: SecretStr | None = None
    metrics_key_sha256: Sha256Hex | None = None
    # A key for the operators' endpoints (GET /admin/health, GET /admin/keys: `gateway keys usage`);
    # null = those endpoints are not served while auth is on.
    admin_key: SecretStr | None = None
    admin_key_sha256: Sha256Hex | None = None
    # ``memory`` (per replica) or a Redis URL (``redis://[:password@]host:port/db``, ``rediss://``,
    # ``unix://``) shared by replicas. A secret: it may carry a password.
    store: SecretStr = SecretStr("memory")
    # Prefix of the Redis keys (deployments sharing one Redis keep their counters apart).
    store_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = "gateway"
    # Seconds a Redis call may take before it counts as an outage (limits then hold per replica).
    redis_timeout: Annotated[float, Field(gt=0, le=60)] = 0.25
    # Seconds between attempts to get back to Redis during an outage.
    redis_retry_interval: Annotated[float, Field(gt=0, le=3600)] = 5.0
    # Seconds a concurrency slot held in Redis lives if its replica dies before releasing it; the
    # replica renews its slots every third of this while their requests run.
    concurrency_lease: Annotated[float, Field(gt=0, le=86400)] = 30.0

    @field_validator("metrics_key", "admin_key")
    @classmethod
    def _long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        return _strong(value)

    @field_validator("store")
    @classmethod
    def _store_url(cls, value: SecretStr) -> SecretStr:
        return memory_or_redis(value)

    @model_validator(mode="after")
    def _distinct(self) -> AuthConfig:
        if self.metrics_key is not None and self.metrics_key_sha256 is not None:
            raise ValueError("give at most one of metrics_key, metrics_key_sha256")
        if self.admin_key is not None and self.admin_key_sha256 is not None:
            raise ValueError("give at most one of admin_key, admin_key_sha256")
        names: dict[str, int] = {}
        digests: dict[str, int] = {}
        for i, key in enumerate(self.keys):
            unique_name(names, key.name, i, "auth.keys", "key")
            if key.sha256 in digests:
                raise ValueError(f"auth.keys[{i}]: the same secret as auth.keys[{digests[key.sha256]}]")
            digests[key.sha256] = i
        metrics, admin = self.metrics_sha256, self.admin_sha256
        if metrics is not None and metrics in digests:
            raise ValueError(f"auth.metrics_key: the same secret as auth.keys[{digests[metrics]}]")
        if admin is not None and admin in digests:
            raise ValueError(f"auth.admin_key: the same secret as auth.keys[{digests[admin]}]")
        if admin is not None and admin == metrics:
            raise ValueError("auth.admin_key: the same secret as auth.metrics_key")
        return self

    @property
    def admin_sha256(self) -> str | None:
        if self.admin_key is None and self.admin_key_sha256 is None:
            return None
        return _sha256_of(self.admin_key, self.admin_key_sha256)

    @property
    def metrics_sha256(self) -> str | None:
        if self.metrics_key is None and self.metrics_key_sha256 is None:
            return None
        return _sha256_of(self.metrics_key, self.metrics_key_sha256)

    @property
    def store_url(self) -> str | None:
        """The Redis URL, or None for the in-memory store."""
        text = self.store.get_secret_value()
        return None if text == "memory" else text
