"""Real parts for the egress tests: a private PKI made in the test, and a forward proxy process.

:class:`PKI` (trustme): a private CA, a server certificate for ``127.0.0.1`` and
``upstream.internal``, an expired one, one for another name, a client certificate for mutual
TLS, and a second CA that signed none of them (the "wrong CA"). :meth:`PKI.server_context` is
what a TLS upstream (``FakeUpstream(ssl_context=...)``) serves with.

:class:`ForwardProxy` runs proxy.py (the ``proxy.py`` package) as a separate process: CONNECT
tunnels and absolute-form forwarding, Basic proxy authentication, optionally TLS towards its
clients (an ``https://`` proxy). It writes its access log to a file, so a test can see that a
request really went through it.

The fixtures (registered for the whole suite by ``tests/conftest.py``): ``pki`` (one per run),
``forward_proxy`` and ``https_forward_proxy`` (one process each per run, started on first use).
"""

from __future__ import annotations

import _socket
import contextlib
import datetime
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

__all__ = [
    "PKI",
    "PROXY_PASSWORD",
    "PROXY_USER",
    "ForwardProxy",
    "RefusingTLSServer",
    "forward_proxy",
    "https_forward_proxy",
    "pki",
]

PROXY_USER = "svc-egress"
PROXY_PASSWORD = "s3cret-proxy-pass"


class PKI:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ca = trustme.CA(organization_name="Gateway Test Private CA")
        self.other_ca = trustme.CA(organization_name="Someone Else's CA")
        self.server = self.ca.issue_cert("127.0.0.1", "upstream.internal")
        past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=30)
        self.expired = self.ca.issue_cert("127.0.0.1", not_before=past - datetime.timedelta(days=30), not_after=past)
        self.elsewhere = self.ca.issue_cert("elsewhere.internal")  # valid, for another name
        self.client = self.ca.issue_cert("gateway-client@example.internal")
        self.ca_file = self._write("ca.pem", self.ca.cert_pem.bytes())
        self.other_ca_file = self._write("other-ca.pem", self.other_ca.cert_pem.bytes())
        self.client_cert_file = self._write("client.pem", b"".join(p.bytes() for p in self.client.cert_chain_pems))
        self.client_key_file = self._write("client.key", self.client.private_key_pem.bytes())
        self.server_pem = self._write("server.pem", self.server.private_key_and_cert_chain_pem.bytes())

    def _write(self, name: str, data: bytes) -> str:
        path = self.folder / name
        path.write_bytes(data)
        return str(path)

    def server_context(self, cert: trustme.LeafCert | None = None, *, require_client: bool = False) -> ssl.SSLContext:
        """The leaf alone, as most servers send it (a root in the chain changes OpenSSL's reason)."""
        cert = cert or self.server
        leaf = self.folder / f"leaf-{id(cert)}.pem"
        leaf.write_bytes(cert.private_key_pem.bytes() + cert.cert_chain_pems[0].bytes())
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(leaf)
        if require_client:
            ctx.verify_mode = ssl.CERT_REQUIRED
            self.ca.configure_trust(ctx)
        return ctx


class ForwardProxy:
    """A proxy.py process on a free loopback port (Basic auth unless ``auth`` is None)."""

    def __init__(self, folder: Path, *, auth: bool = True, tls_pem: str | None = None) -> None:
        self.folder = folder
        self.auth = auth
        self.tls = tls_pem is not None
        self.log = folder / "access.log"
        port_file = folder / "port"
        args = [sys.executable, "-m", "proxy", "--hostname", "127.0.0.1", "--port", "0"]
        args += ["--port-file", str(port_file), "--num-workers", "1", "--num-acceptors", "1"]
        args += ["--log-file", str(self.log), "--log-level", "INFO"]
        if auth:
            args += ["--basic-auth", f"{PROXY_USER}:{PROXY_PASSWORD}"]
        if tls_pem is not None:
            args += ["--cert-file", tls_pem, "--key-file", tls_pem]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"proxy.py did not start (exit {self.process.returncode})")
            time.sleep(0.02)
        self.port = int(port_file.read_text())

    def url(self, user: str | None = PROXY_USER, password: str = PROXY_PASSWORD) -> str:
        scheme = "https" if self.tls else "http"
        creds = f"{user}:{password}@" if user is not None else ""
        return f"{scheme}://{creds}127.0.0.1:{self.port}"

    def saw(self, what: str) -> bool:
        """Whether the access log has a line with ``what`` (e.g. ``CONNECT 127.0.0.1:PORT``)."""
        return self.log.exists() and what in self.log.read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class RefusingTLSServer:
    """A TLS server that requires a client certificate and refuses every handshake without one.

    Like nginx or envoy it sends the TLS alert, and it keeps the socket open until the client hangs
    up, so the alert reaches the client before any reset (an asyncio server closes without flushing
    it; a close with our request unread becomes a reset that may overtake the alert, however long
    one waits first on a loaded machine). ``refused`` is set once a handshake was refused.
    """

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._ctx = ctx
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.handshakes_refused = 0
        self.refused = threading.Event()
        self._stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        self._sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._refuse, args=(conn,), daemon=True).start()

    def _refuse(self, conn: socket.socket) -> None:
        conn.settimeout(30)
        tls = self._ctx.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        try:
            tls.do_handshake()
        except (ssl.SSLError, OSError):
            self.handshakes_refused += 1
            self.refused.set()
            # The alert is on its way: close only once the client, having read it, hung up
            # (the raw socket's reads, past TLS, end with its FIN or reset).
            with contextlib.suppress(OSError):
                while _socket.socket.recv(tls, 65536):
                    pass
        tls.close()

    def stop(self) -> None:
        self._stop.set()
        self._sock.close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def forward_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForwardProxy]:
    """proxy.py over plain http, with Basic auth (``PROXY_USER`` / ``PROXY_PASSWORD``)."""
    proxy = ForwardProxy(tmp_path_factory.mktemp("proxy"))
    yield proxy
    proxy.stop()


@pytest.fixture(scope="session")
def https_forward_proxy(tmp_path_factory: pytest.TempPathFactory, pki: PKI) -> Iterator[ForwardProxy]:
    """proxy.py serving TLS itself (a certificate of ``pki``), with Basic auth."""
    proxy = ForwardProxy(tmp_path_factory.mktemp("https-proxy"), tls_pem=pki.server_pem)
    yield proxy
    proxy.stop()
