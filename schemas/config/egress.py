"""How an HTTP backend leaves the gateway: a forward proxy, TLS towards the upstream, the environment.

Checked at load with the files themselves: a CA bundle, certificate or key that cannot be
read or does not fit is an error at its YAML path (``backends[0].tls.cert_file``), not a
failure at the first request. A proxy URL is a secret (it may carry credentials) and is
never echoed in a message.
"""

from __future__ import annotations

import ssl
import urllib.request
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["TLSConfig", "check_env_proxies", "check_proxy_url"]

_HOSTNAME = r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$"


def _readable(path: str | None) -> str | None:
    if path is not None:
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ValueError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    return path


class TLSConfig(BaseModel):
    """TLS towards the upstream (and towards an ``https://`` proxy): a private CA, mutual TLS, lab mode."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # as every section (common._Strict)

    # PEM bundle of the CAs that may sign the upstream's certificate; replaces the system
    # store for this backend (as curl's --cacert does). Default: the system store.
    ca_file: str | None = None
    # Mutual TLS: the client certificate (PEM, chain included) and its unencrypted key
    # (omit key_file when cert_file holds both).
    cert_file: str | None = None
    key_file: str | None = None
    # false: the upstream's certificate is not checked at all (a lab; logged as a warning
    # at start-up and on every reload).
    verify: bool = True
    # The name sent as SNI and checked against the certificate, when it is not the URL's host
    # (an upstream reached by IP, or servers found by DNS discovery).
    server_name: Annotated[str, Field(max_length=253, pattern=_HOSTNAME)] | None = None

    _files = field_validator("ca_file", "cert_file", "key_file")(_readable)

    @model_validator(mode="after")
    def _loads(self) -> TLSConfig:
        if self.key_file is not None and self.cert_file is None:
            raise ValueError("key_file needs cert_file (the certificate it belongs to)")
        if self.ca_file is not None and not self.verify:
            raise ValueError("ca_file has no use with verify: false (nothing is checked); drop one of them")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if self.ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=self.ca_file)
            except (ssl.SSLError, ValueError) as exc:
                raise ValueError(f"ca_file {self.ca_file!r} holds no usable PEM certificate ({_why(exc)})") from None
        if self.cert_file is not None:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            except ssl.SSLError as exc:
                raise ValueError(
                    f"cert_file {self.cert_file!r}"
                    + (f" with key_file {self.key_file!r}" if self.key_file else "")
                    + f" is not a usable certificate and key ({_why(exc)})"
                ) from None
        return self


def _why(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return reason.lower().replace("_", " ") if isinstance(reason, str) else str(exc)


def check_proxy_url(value: SecretStr | None) -> SecretStr | None:
    """An ``http://`` or ``https://`` proxy with a host and nothing after it; the value is never echoed."""
    if value is not None:
        problem = _proxy_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(f"proxy {problem}")
    return value


def check_env_proxies() -> None:
    """With ``trust_env``: the environment's ``HTTPS_PROXY`` / ``HTTP_PROXY`` must be usable proxies.

    Read at load, as the backend will read them; ``proxy:3128`` without a scheme means http.
    """
    for scheme, text in urllib.request.getproxies_environment().items():
        if scheme in ("http", "https") and text:
            problem = _proxy_problem(text if "://" in text else "http://" + text)
            if problem is not None:
                raise ValueError(f"with trust_env, the environment's {scheme}_proxy {problem}")


def _proxy_problem(text: str) -> str | None:
    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if parts.scheme.lower() not in ("http", "https"):
        return "must be an http:// or https:// URL (e.g. http://proxy.internal:3128)"
    if not parts.hostname:
        return "names no host (e.g. http://proxy.internal:3128)"
    if port == 0:
        return "has a port that is not a number in 1-65535"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return (
            "must be scheme://[user:password@]host[:port] with nothing after it "
            "(percent-encode '/', '?', '#' and '@' in credentials)"
        )
    return None
