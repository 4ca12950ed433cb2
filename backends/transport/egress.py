"""How one HTTP backend reaches its upstreams: TLS context, forward proxy, the environment it trusts.

Built once per transport from the backend's config (:func:`egress_of`: at start-up and when a
reload rebuilds the backend; the environment is read then, never per request) and used the
same way by every client of the seam (httptools, aiohttp, httpx):

- TLS: ``tls.ca_file`` alone (it replaces the system store), else the system store (OpenSSL's
  built-in paths; certifi's bundle where the system has none), or with ``trust_env`` the store
  OpenSSL finds through ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``. ``tls.cert_file``/``key_file``:
  the client certificate of mutual TLS; ``tls.verify: false`` checks nothing
  (:func:`warn_unverified` says so at start-up and reload); ``tls.server_name``: the SNI and
  the name checked, instead of the URL's host.
- Proxy: ``proxy`` for every upstream of the backend; else, with ``trust_env``, ``HTTPS_PROXY``
  for https and ``HTTP_PROXY`` for http upstreams unless ``NO_PROXY`` covers the host. An https
  upstream is reached through a ``CONNECT`` tunnel, a plain-http one by absolute-form requests
  sent to the proxy. An ``https://`` proxy is verified with the same TLS context.
- Keep-alive: a transport serves one backend, so each pool is per proxy and per TLS identity.

Failures are typed here for all three clients (``backends.errors``): :func:`tls_error`
(OpenSSL's reason in words), :func:`proxy_unreachable`, :func:`proxy_refused` (407, a refused
CONNECT). Messages name the backend, never a host, a proxy URL or credentials.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import ssl
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from backends.errors import UpstreamProxyError, UpstreamTLSError
from schemas.config import HTTPUpstreamConfig

__all__ = [
    "Egress",
    "Proxy",
    "default_context",
    "egress_of",
    "find_ssl_error",
    "no_proxy",
    "proxy_refused",
    "proxy_unreachable",
    "tls_error",
    "warn_unverified",
]

log = logging.getLogger("gateway.egress")

_default: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class Proxy:
    """A forward proxy; ``url`` has no credentials (safe to log), ``authorization`` is a secret."""

    url: str
    scheme: str
    host: str
    port: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    authorization: str | None = field(default=None, repr=False)  # the Proxy-Authorization value

    @classmethod
    def parse(cls, url: str) -> Proxy:
        if "://" not in url:
            url = "http://" + url  # HTTPS_PROXY=proxy:3128, as curl and requests read it
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        try:
            port = parts.port
        except ValueError:
            port = -1
        if scheme not in ("http", "https") or not parts.hostname or port == -1 or port == 0:
            raise ValueError("not an http:// or https:// proxy URL")
        host = parts.hostname
        port = port or (443 if scheme == "https" else 80)
        user = unquote(parts.username) if parts.username is not None else None
        password = unquote(parts.password) if parts.password is not None else None
        auth = None
        if user is not None:
            token = base64.b64encode(f"{user}:{password or ''}".encode()).decode("ascii")
            auth = f"Basic {token}"
        shown = f"[{host}]" if ":" in host else host
        return cls(f"{scheme}://{shown}:{port}", scheme, host, port, user, password, auth)


class Egress:
    """One backend's way out (see the module docstring); immutable once built, shared by its transports."""

    __slots__ = ("_env", "_proxy", "backend", "server_name", "ssl", "verify")

    def __init__(
        self,
        backend: str,
        context: ssl.SSLContext | None = None,
        *,
        server_name: str | None = None,
        verify: bool = True,
        proxy: Proxy | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.backend = backend
        self.ssl = context if context is not None else default_context()
        self.server_name = server_name
        self.verify = verify
        self._proxy = proxy
        # With trust_env: urllib's reading of the *_proxy variables ({"https": url, "no": hosts}).
        self._env = dict(env) if env else None

    @property
    def direct(self) -> bool:
        """Nothing to route: no proxy anywhere and the URL's host is the TLS name (the plain path)."""
        return self._proxy is None and not self._env and self.server_name is None

    def proxy_for(self, scheme: str, host: str, port: int) -> Proxy | None:
        """The proxy an upstream at ``scheme://host:port`` is reached through, or None (direct)."""
        if self._proxy is not None:
            return self._proxy
        env = self._env
        if not env or scheme not in env:
            return None
        if "no" in env and no_proxy(env["no"], host, port):
            return None
        return Proxy.parse(env[scheme])


def no_proxy(entries: str, host: str, port: int) -> bool:
    """Whether ``NO_PROXY`` covers ``host:port``, as curl reads it: ``*``; a name and its subdomains
    (``example.com``, ``.example.com``); an address or a CIDR range (``10.0.0.0/8``); ``:port`` narrows."""
    host = host.lower().strip("[]").rstrip(".")
    try:
        addr: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for raw in entries.replace(" ", ",").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        if entry.startswith("["):  # [v6]:port
            entry, _, rest = entry[1:].partition("]")
            want = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:  # name:port (a bare v6 address has more colons)
            entry, _, want = entry.partition(":")
        else:
            want = ""
        if want and (not want.isdigit() or int(want) != port):
            continue
        entry = entry.lstrip("*").lstrip(".").rstrip(".")
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        if host == entry or host.endswith("." + entry):
            return True
    return False


def default_context() -> ssl.SSLContext:
    """The system's trust store, without the environment's say (built once per process, shared)."""
    global _default
    if _default is None:
        _default = _system_store()
    return _default


def _system_store() -> ssl.SSLContext:
    paths = ssl.get_default_verify_paths()
    cafile = paths.openssl_cafile if os.path.isfile(paths.openssl_cafile) else None
    capath = paths.openssl_capath if os.path.isdir(paths.openssl_capath) else None
    if cafile is None and capath is None:  # no system store (some slim images, python.org macOS builds)
        import certifi  # httpx's dependency, so always here

        cafile = certifi.where()
    return ssl.create_default_context(cafile=cafile, capath=capath)


def _context(config: HTTPUpstreamConfig) -> ssl.SSLContext:
    tls = config.tls
    if tls is None or (tls.verify and tls.ca_file is None and tls.cert_file is None):
        return ssl.create_default_context() if config.trust_env else default_context()
    if not tls.verify:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif tls.ca_file is not None:
        ctx = ssl.create_default_context(cafile=tls.ca_file)
    else:  # a client certificate over the usual store: a context of its own, not the shared one
        ctx = ssl.create_default_context() if config.trust_env else _system_store()
    if tls.cert_file is not None:
        ctx.load_cert_chain(tls.cert_file, tls.key_file)
    return ctx


def env_proxies() -> dict[str, str]:
    """``HTTPS_PROXY`` / ``HTTP_PROXY`` / ``NO_PROXY`` as urllib reads them (either case)."""
    found = urllib.request.getproxies_environment()
    return {k: v for k, v in found.items() if k in ("http", "https", "no") and v}


def egress_of(config: HTTPUpstreamConfig) -> Egress:
    """The egress of ``config``'s backend: its TLS context (files read now) and proxy routing."""
    proxy = Proxy.parse(config.proxy.get_secret_value()) if config.proxy is not None else None
    tls = config.tls
    return Egress(
        config.name,
        _context(config),
        server_name=tls.server_name if tls is not None else None,
        verify=tls.verify if tls is not None else True,
        proxy=proxy,
        env=env_proxies() if config.trust_env and proxy is None else None,
    )


def warn_unverified(configs: Iterable[object], when: str) -> None:
    """A WARNING per backend whose upstream certificate is not checked (``tls.verify: false``)."""
    for config in configs:
        tls = getattr(config, "tls", None)
        if tls is not None and not tls.verify:
            log.warning(
                "%s: backend %s: tls.verify is false: its upstream's TLS certificate is NOT checked, so "
                "anyone on the path can read and answer its traffic (a lab setting, never production)",
                when,
                getattr(config, "name", "?"),
            )


# --- failures, typed for every client ---------------------------------------------------------------


def find_ssl_error(exc: BaseException | None) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind a client library's exception (its cause/context chain), if any."""
    seen = 0
    while exc is not None and seen < 8:
        # aiohttp's wrappers subclass ssl.SSLError themselves, without OpenSSL's fields: the inner one first
        inner = getattr(exc, "certificate_error", None) or getattr(exc, "os_error", None)
        if isinstance(inner, ssl.SSLError):
            return inner
        if isinstance(exc, ssl.SSLError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def tls_error(exc: ssl.SSLError, backend: str, *, proxy: bool = False) -> UpstreamTLSError:
    """``exc`` as the client's 502: OpenSSL's reason in words (``certificate verify failed: ...``)."""
    peer = "its proxy" if proxy else "the upstream"
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = f"certificate verify failed: {exc.verify_message}"
    else:
        reason = exc.reason if isinstance(exc.reason, str) else None
        why = reason.lower().replace("_", " ") if reason else (exc.strerror or type(exc).__name__)
        if "alert" in why:
            why += f" (sent by {peer}: it refused the handshake, e.g. the gateway's client certificate or its absence)"
    return UpstreamTLSError(f"backend {backend!r}: TLS with {peer} failed: {why}", backend=backend)


def proxy_unreachable(exc: BaseException, backend: str) -> UpstreamProxyError:
    return UpstreamProxyError(f"backend {backend!r}: cannot reach its proxy ({type(exc).__name__})", backend=backend)


def proxy_refused(status: int, backend: str) -> UpstreamProxyError:
    """The proxy's non-2xx answer to CONNECT (or, for a plain-http upstream, its 407)."""
    if status == 407:
        return UpstreamProxyError(
            f"backend {backend!r}: its proxy refused the gateway's credentials (407 Proxy Authentication Required)",
            backend=backend,
            reason="proxy_auth",
            code="upstream_proxy_auth_failed",
            retry_here=False,
        )
    away = status in (502, 503, 504)
    return UpstreamProxyError(
        f"backend {backend!r}: its proxy would not open a tunnel to the upstream ({status})",
        backend=backend,
        retry_here=away,
    )
