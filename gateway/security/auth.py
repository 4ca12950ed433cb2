"""API keys: who is calling, and which models they may use.

A client presents its key as ``Authorization: Bearer <key>`` (OpenAI's clients) or as an
``api-key: <key>`` header (Azure-style clients). The gateway keeps no secret in memory: each
configured key is held as the SHA-256 digest of its secret (given in the YAML as ``key`` or
directly as ``key_sha256``). A presented key is hashed once and looked up by digest in a
dict: O(1) whatever the number of keys, and what the lookup's timing could reveal is
about a digest, not about the secret; the hit is then confirmed with
:func:`hmac.compare_digest`.

Model permissions are resolved once, at start-up: each key's names and globs are matched
against the configured models, so a request checks one frozenset membership (``GET /v1/models``
lists only those: ``gateway.catalog``).

Errors: a missing or unknown key is a 401 ``authentication_error``; a model the key may not
use is a 403 ``permission_error``. Neither message ever contains the presented key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.security.caps import Caps
from gateway.security.ratelimit import Limits
from schemas.config import ApiKeyConfig, AuthConfig, RequestCaps
from schemas.errors import AuthenticationError, PermissionDeniedError

__all__ = [
    "API_KEY",
    "ApiKey",
    "AuthenticationError",
    "KeyRing",
    "PermissionDeniedError",
    "presented_key",
    "protect",
    "request_key",
    "require",
]


@dataclass(frozen=True, slots=True)
class ApiKey:
    """One configured key, as the request path needs it (no secret, only its digest)."""

    name: str
    digest: bytes
    models: frozenset[str]
    limits: Limits
    caps: Caps


def request_key(name: str, kind: type) -> Any:
    """A key for per-request storage: ``web.RequestKey`` where aiohttp has it (3.14+: no
    ``NotAppKeyWarning`` on each store), else the plain string."""
    maker = getattr(web, "RequestKey", None)
    return maker(name, kind) if maker is not None else name


# Where the completion and models routes keep the caller's :class:`ApiKey` on the request.
API_KEY = request_key("gateway_api_key", ApiKey)

_NO_KEY = "Missing API key: send it as 'Authorization: Bearer <key>' or in an 'api-key' header."
_BAD_KEY = "Incorrect API key provided."


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries, or None. ``Authorization: Bearer`` wins over ``api-key``."""
    value = headers.get("Authorization")
    if value is not None:
        scheme, _, token = value.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    value = headers.get("api-key")
    return (value.strip() or None) if value is not None else None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


def _allowed_models(patterns: Iterable[str], models: Iterable[str]) -> frozenset[str]:
    names = list(models)
    return frozenset(name for name in names if any(fnmatch.fnmatchcase(name, p) for p in patterns))


class KeyRing:
    """The configured keys, by digest. Built once; read-only afterwards (safe to share)."""

    def __init__(
        self,
        auth: AuthConfig,
        *,
        models: Iterable[str],
        deployment_caps: RequestCaps,
        max_prompt_array: int,
    ) -> None:
        names = list(models)
        self._by_digest: dict[bytes, ApiKey] = {}
        self.keys: list[ApiKey] = []
        for entry in auth.keys:
            key = self._build(entry, names, deployment_caps, max_prompt_array)
            self._by_digest[key.digest] = key
            self.keys.append(key)
        metrics, admin = auth.metrics_sha256, auth.admin_sha256
        self.metrics_digest: bytes | None = bytes.fromhex(metrics) if metrics is not None else None
        self.admin_digest: bytes | None = bytes.fromhex(admin) if admin is not None else None

    @staticmethod
    def _build(entry: ApiKeyConfig, names: list[str], caps: RequestCaps, max_prompt_array: int) -> ApiKey:
        allowed = _allowed_models(entry.models, names)
        return ApiKey(
            name=entry.name,
            digest=bytes.fromhex(entry.sha256),
            models=allowed,
            limits=Limits(entry.rpm, entry.tpm, entry.max_concurrent),
            caps=Caps.build(max_prompt_array, caps, entry.caps, entry.name),
        )

    @property
    def names(self) -> list[str]:
        return [key.name for key in self.keys]

    def identify(self, headers: Mapping[str, str]) -> ApiKey:
        """The key a request presents; raises :class:`AuthenticationError` (401)."""
        secret = presented_key(headers)
        if secret is None:
            raise AuthenticationError(_NO_KEY)
        digest = _digest(secret)
        key = self._by_digest.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            raise AuthenticationError(_BAD_KEY)
        return key

    @staticmethod
    def check_model(key: ApiKey, model: str) -> None:
        """Raise :class:`PermissionDeniedError` (403) when ``key`` may not use the configured ``model``."""
        if model not in key.models:
            raise PermissionDeniedError(
                f"The API key '{key.name}' is not allowed to use the model '{model}'.", param="model"
            )


def require(headers: Mapping[str, str], digest: bytes) -> None:
    """Raise :class:`AuthenticationError` (401) unless ``headers`` present the key whose SHA-256 is ``digest``."""
    secret = presented_key(headers)
    if secret is None:
        raise AuthenticationError(_NO_KEY)
    if not hmac.compare_digest(_digest(secret), digest):
        raise AuthenticationError(_BAD_KEY)


def protect(handler: Handler, digest: bytes) -> Handler:
    """``handler`` behind its own key (e.g. ``GET /metrics`` behind ``auth.metrics_key``)."""

    async def protected(request: web.Request) -> web.StreamResponse:
        require(request.headers, digest)
        return await handler(request)

    return protected
