"""What a vLLM backend knows of its server, and how it keeps that true: the version and the models.

:class:`VLLMServer` is the part of :class:`~backends.vllm.adapter.VLLMBackend` that reads the
server: ``GET /version`` at start-up and again after the server was unreachable (a restart may be
an upgrade) or answered with another version in its ``system_fingerprint`` (:meth:`_saw`), a YAML
``version:`` pin standing in while the endpoint does not answer; ``GET /v1/models`` for each served
model's ``max_model_len`` and ``root``; and, for a stream whose constraint's form depends on the
version, a version read just now. Switching the dialect and tables on a new version is the
adapter's (``_use``). Re-reads are single-flight (a lock) and rate-limited.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import orjson

from backends.errors import UpstreamError
from backends.openai.wire import OpenAIWire
from backends.vllm.dialect import VLLMDialect, fingerprint_version
from backends.vllm.versions import VLLMVersion, parse_version
from schemas.errors import UnsupportedParameterError

__all__ = ["VLLMServer"]

log = logging.getLogger("gateway.vllm")

_DETECT_TIMEOUT = 10.0  # seconds for GET /version (start-up must not hang on a silent server)
_RETRY_INTERVAL = 1.0  # seconds between two detection attempts while the server is unreachable
# A streamed constraint sent as top-level guided_* (< 0.11) would fail open on a server upgraded
# to >= 0.12 behind a kept-alive connection, and a stream cannot be resent once it has started:
# such streams re-confirm a version older than this (seconds) first. Non-streamed answers are
# checked after the fact instead (their system_fingerprint names the version) and resent.
_CONFIRM_AGE = 1.0


class VLLMServer:
    """The server-reading half of ``VLLMBackend`` (a mixin: the adapter's ``__init__`` sets this state)."""

    name: str
    base_url: str
    _wire: OpenAIWire
    _root: str
    _pin: VLLMVersion | None
    _lock: asyncio.Lock
    _stale: bool  # re-read the version before the next request
    _last_attempt: float
    _fingerprint: str | None
    _seen: VLLMVersion | None  # from the last new system_fingerprint
    _confirmed_at: float  # loop time of the last successful GET /version
    _models: dict[str, dict[str, Any]]  # GET /v1/models: id -> {max_model_len, root}
    version: VLLMVersion | None
    version_source: str  # "detected" | "fingerprint" | "pinned" | "unknown"
    dialect: VLLMDialect

    def _init_server(self, pin: VLLMVersion | None) -> None:
        """Nothing read yet: the pin (or nothing) stands in (the adapter's ``__init__``, before its ``_use``)."""
        self._pin = pin
        self._lock = asyncio.Lock()
        self._stale = False
        self._last_attempt = -_RETRY_INTERVAL
        self._fingerprint = None
        self._seen = None
        self._confirmed_at = -_CONFIRM_AGE
        self._models = {}
        self.version = None
        self.version_source = "unknown"
        self.dialect = VLLMDialect.of(None)

    if TYPE_CHECKING:

        def _use(self, version: VLLMVersion | None, source: str) -> None: ...  # the adapter's: dialect, tables

    async def detect_version(self) -> VLLMVersion | None:
        """``GET /version``; falls back to the pin (or keeps what it knew) when it gets no version."""
        self._last_attempt = asyncio.get_running_loop().time()
        try:
            status, data = await self._get(self._root + "/version")
        except (UpstreamError, TimeoutError) as exc:
            self._stale = True  # unreachable: try again before a later request
            log.warning(
                "vLLM backend %s: GET /version failed (%s); using %s version %s",
                self.name,
                exc,
                self.version_source,
                self.dialect.features.label,
            )
            return self.version
        self._stale = False
        await self._read_models()  # reachable: a (re)started server may serve another model or length
        version = None
        if status == 200:
            self._confirmed_at = self._last_attempt
            try:
                answer: Any = orjson.loads(data)
                version = parse_version(str(answer.get("version", ""))) if isinstance(answer, dict) else None
            except orjson.JSONDecodeError:
                version = None
        if version is None and self._seen is not None:
            # No /version (e.g. a proxy exposes only /v1), but the server named itself in an answer.
            self._use(self._seen, "fingerprint")
        elif version is None:
            self._use(self._pin, "pinned" if self._pin else "unknown")
            log.warning(
                "vLLM backend %s: GET /version gave no version (HTTP %s); using %s version %s",
                self.name,
                status,
                self.version_source,
                self.dialect.features.label,
            )
        elif version != self.version or self.version_source != "detected":
            if self._pin and self._pin != version:
                log.warning(
                    "vLLM backend %s: server reports %s, pin says %s; using %s", self.name, version, self._pin, version
                )
            self._use(version, "detected")
            log.info("vLLM backend %s: server version %s", self.name, version)
        return self.version

    async def _get(self, url: str) -> tuple[int, bytes]:
        """``GET url`` within the detection timeout: its status and body (the connection released)."""
        async with asyncio.timeout(_DETECT_TIMEOUT):
            resp = await self._wire.get(url)
            try:
                return resp.status, await resp.read()
            finally:
                resp.release()

    async def _read_models(self) -> None:
        """``GET /v1/models``: each served model's ``max_model_len`` (:meth:`context_length`) and ``root``
        (:meth:`model_info`); what it cannot read stays as it was."""
        try:
            status, data = await self._get(self.base_url + "/models")
            listing: Any = orjson.loads(data) if status == 200 else None
        except Exception as exc:  # optional: a failed listing never stops start-up (nor a reconnect)
            log.info("vLLM backend %s: GET /v1/models failed (%s); models keep what was known", self.name, exc)
            return
        entries = listing.get("data") if isinstance(listing, dict) else None
        if isinstance(entries, list):
            self._models = _model_infos(entries)

    def models_listing(self) -> list[dict[str, Any]]:
        """What :meth:`_read_models` learnt, as ``/v1/models`` entries (``id``, ``max_model_len``,
        ``root``): what the control process of ``--workers N`` tells the workers (:meth:`learn_models`)."""
        return [{"id": name, **info} for name, info in self._models.items()]

    def learn_models(self, entries: object) -> None:
        """``/v1/models`` entries read elsewhere (a worker's adapter: by the control process); else no change."""
        if isinstance(entries, list):
            self._models = _model_infos(entries)

    def model_info(self, upstream_model: str) -> dict[str, Any] | None:
        return self._models.get(upstream_model)

    def context_length(self, upstream_model: str) -> int | None:
        info = self._models.get(upstream_model)
        return None if info is None else info.get("max_model_len")

    async def _refresh(self) -> None:
        async with self._lock:
            if self._stale and asyncio.get_running_loop().time() - self._last_attempt >= _RETRY_INTERVAL:
                await self.detect_version()

    def _confirmed_recently(self) -> bool:
        return asyncio.get_running_loop().time() - self._confirmed_at <= _CONFIRM_AGE

    def _saw(self, obj: dict[str, Any]) -> None:
        """Notice a changed ``system_fingerprint`` (``vllm-X.Y.Z-...``): the server may have been replaced."""
        fingerprint = obj.get("system_fingerprint")
        if fingerprint != self._fingerprint and isinstance(fingerprint, str):
            self._fingerprint = fingerprint
            seen = fingerprint_version(obj)
            if seen is not None and seen != self.version:
                self._seen = seen
                self._stale = True

    async def _confirm_for_stream(self, guide: str) -> None:
        """A streamed constraint in the old (top-level guided_*) form needs a version read just now."""
        if not self._confirmed_recently():
            asked = asyncio.get_running_loop().time()
            async with self._lock:
                # Single flight: streams that queued behind a GET /version begun after they asked
                # take its answer (whatever it was) instead of each sending their own.
                if self._last_attempt < asked and not self._confirmed_recently():
                    await self.detect_version()
        if self.version_source != "detected" and not self.dialect.features.structured_outputs:
            raise UnsupportedParameterError(
                f"'{guide}' cannot be streamed by backend '{self.name}': its vLLM version ({self.version_source} "
                f"{self.dialect.features.label}) cannot be confirmed by GET /version, and a vLLM >= 0.12 would "
                "ignore this form of the constraint; send the request without stream",
                param=guide,
                backend=self.name,
            )


def _model_infos(entries: list[Any]) -> dict[str, dict[str, Any]]:
    """``/v1/models`` entries -> id -> ``{max_model_len, root}``, each kept only when well typed."""
    models: dict[str, dict[str, Any]] = {}
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str):
            length, root = entry.get("max_model_len"), entry.get("root")
            info: dict[str, Any] = {}
            if type(length) is int and length > 0:
                info["max_model_len"] = length
            if type(root) is str:
                info["root"] = root
            models[entry["id"]] = info
    return models
