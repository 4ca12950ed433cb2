"""Each remote backend called once, to catch what a config check cannot: ``gateway check-config --probe``
and the warning ``gateway serve`` logs at start-up.

For an OpenAI-shaped backend (``openai``, ``vllm``: each of its ``base_urls``) one ``GET {base_url}/models``:

- a 404 there while ``{base_url}/v1/models`` answers: the ``base_url`` lacks ``/v1`` (every request
  would fail as "not found"), named with the URL to write instead;
- a route's upstream ``model`` the list does not hold, named with its YAML path and the nearest listed id;
- credentials refused, another status, a body that is no model list.

A native backend (TGI, Ollama, llama.cpp, TEI) gets one ``GET`` of its root: any answer means reachable.
A backend that cannot be reached (refused, timed out, a TLS or proxy failure) is listed as unreachable.
``mock`` and ``vllm-pool`` (the gateway's own) and ``discovery`` (servers found later) are not called.
Through the backend's own transport, so its proxy, TLS and timeouts apply. Findings name URLs without
credentials; nothing here changes how requests are served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import orjson

from backends.errors import UpstreamError
from backends.transport import HTTPTransport, make_transport
from schemas.config import GatewayConfig, HTTPUpstreamConfig
from schemas.config.references import did_you_mean

__all__ = ["Finding", "probe", "probe_in_background", "shown_url"]

log = logging.getLogger("gateway.probe")

_OPENAI_SHAPED = ("openai", "vllm")
_LISTED_SHOWN = 8  # model ids quoted in a "not listed" finding


@dataclass(frozen=True)
class Finding:
    """One thing the probe found wrong: the backend, what (``unreachable``, ``base_url``, ``model``,
    ``status``) and a sentence an operator can act on."""

    backend: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"{self.backend}: {self.message}"


def shown_url(url: str) -> str:
    """``url`` without user information (a credential), as findings and logs may show it."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))


def _headers(config: HTTPUpstreamConfig) -> dict[str, str]:
    headers = {name: value.get_secret_value() for name, value in config.headers.items()}
    if config.api_key is not None:
        headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
    return headers


async def _get(transport: HTTPTransport, url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    resp = await transport.send("GET", url, body=None, headers=headers, stream=False)
    try:
        return resp.status, await resp.read()
    finally:
        resp.release()


def _model_ids(body: bytes) -> list[str] | None:
    """The ids of an OpenAI model list (``{"data": [{"id": ...}]}``), None for another shape."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = obj.get("data") if isinstance(obj, dict) else None
    if not isinstance(data, list):
        return None
    return [item["id"] for item in data if isinstance(item, dict) and isinstance(item.get("id"), str)]


class _Probe:
    """One backend's calls (its own transport, closed after) and what they found."""

    def __init__(self, config: HTTPUpstreamConfig, openai_shaped: bool, routes: list[tuple[str, str]]) -> None:
        self.config = config
        self.openai_shaped = openai_shaped
        self.routes = routes  # (YAML path of the route's model, the upstream model)
        self.headers = _headers(config)
        self.findings: list[Finding] = []

    def found(self, kind: str, message: str) -> None:
        self.findings.append(Finding(self.config.name, kind, message))

    async def run(self, urls: list[str]) -> list[Finding]:
        transport = make_transport(self.config)
        try:
            for url in urls:
                try:
                    if self.openai_shaped:
                        await self._models(transport, url)
                    else:
                        await _get(transport, url + "/", self.headers)  # any answer: reachable
                except UpstreamError as exc:
                    self.found("unreachable", f"{shown_url(url)} is unreachable: {exc.message}")
        finally:
            await transport.close()
        return self.findings

    async def _models(self, transport: HTTPTransport, url: str) -> None:
        shown = shown_url(url)
        status, body = await _get(transport, url + "/models", self.headers)
        if status == 404 and not url.rstrip("/").endswith("/v1"):
            try:
                retry, _ = await _get(transport, url + "/v1/models", self.headers)
            except UpstreamError:
                retry = 0
            if retry == 200:
                self.found(
                    "base_url",
                    f"base_url {shown} answers 404 on /models but {shown}/v1/models answers: "
                    f"set base_url to {shown}/v1 (every request would fail as not found)",
                )
                return
        if status in (401, 403):
            self.found("status", f"{shown}/models refused the gateway's credentials ({status}): check api_key")
            return
        if status != 200:
            self.found("status", f"{shown}/models answered {status}: check base_url")
            return
        ids = _model_ids(body)
        if ids is None:
            self.found("status", f"{shown}/models answered 200 with no model list: check base_url")
            return
        for path, model in self.routes:
            if model not in ids:
                listed = ", ".join(ids[:_LISTED_SHOWN]) + (", ..." if len(ids) > _LISTED_SHOWN else "")
                self.found(
                    "model",
                    f"{path}: {model!r} is not listed by {shown}/models{did_you_mean(model, ids)} "
                    f"(listed: {listed or 'none'})",
                )


def _targets(config: GatewayConfig) -> Iterable[tuple[_Probe, list[str]]]:
    for backend in config.backends:
        if not isinstance(backend, HTTPUpstreamConfig):
            continue  # mock, vllm-pool (the gateway's own workers)
        urls = [str(u).rstrip("/") for u in [backend.base_url, *getattr(backend, "base_urls", [])] if u]
        if not urls:
            continue  # discovery: the servers are found at run time
        routes = [
            (f"models[{i}].routes[{j}].model", route.model)
            for i, model in enumerate(config.models)
            for j, route in enumerate(model.routes)
            if route.backend == backend.name
        ]
        yield _Probe(backend, backend.type in _OPENAI_SHAPED, routes), urls


async def probe(config: GatewayConfig, *, within: float = 10.0) -> list[Finding]:
    """Every backend probed at once; what was found, in the config's order (a backend still
    unanswered after ``within`` seconds is listed as unreachable)."""
    targets = list(_targets(config))

    async def one(target: _Probe, urls: list[str]) -> list[Finding]:
        try:
            return await asyncio.wait_for(target.run(urls), within)
        except TimeoutError:
            return [Finding(target.config.name, "unreachable", f"no answer within {within:g} s")]

    results = await asyncio.gather(*(one(target, urls) for target, urls in targets))
    return [finding for found in results for finding in found]


async def _log_findings(config: GatewayConfig, source: str) -> None:
    try:
        findings = await probe(config)
    except Exception:  # the check must never take the gateway down
        log.exception("start-up probe failed")
        return
    for finding in findings:
        log.warning("start-up probe: %s: %s", source, finding)
    if findings:
        log.warning(
            "start-up probe: %d problem(s) (gateway check-config --probe %s lists them); serving anyway",
            len(findings),
            source,
        )


def probe_in_background(config: GatewayConfig, source: str) -> asyncio.Task[None]:
    """The start-up warning: :func:`probe` in a task that logs each finding (the caller cancels it at exit)."""
    return asyncio.create_task(_log_findings(config, source), name="start-up probe")
