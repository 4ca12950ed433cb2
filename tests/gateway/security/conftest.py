"""Fixtures for the security tests: gateways with ``auth:``/``caps:`` sections, and a real redis-server.

Keys used throughout (each at least 16 characters, as the config requires):

- ``KEY_A`` (key name ``team-a``): every model;
- ``KEY_B`` (key name ``team-b``): only ``mock-*`` models, given in the YAML as its SHA-256.

``redis_server`` starts ``redis-server`` on a free loopback port with a temporary directory
and no persistence; tests using it skip when the binary is missing (``.ci/run`` installs it).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.configfile import parse_config
from tests.conftest import RunningGateway, free_port, gateway_config_text, serve_app
from tests.fakes import FakeUpstream

KEY_A = "sk-team-a-0123456789abcdef"
KEY_B = "sk-team-b-fedcba9876543210"
KEY_B_SHA256 = hashlib.sha256(KEY_B.encode()).hexdigest()
METRICS_KEY = "sk-metrics-scraper-00112233"

AUTH_A = {"Authorization": f"Bearer {KEY_A}"}
AUTH_B = {"api-key": KEY_B}


def auth_section(
    *,
    a: str = "",
    b: str = "",
    extra: str = "",
) -> str:
    """An ``auth:`` section with team-a and team-b; ``a``/``b`` add YAML mapping entries to each key
    (``"rpm: 2, tpm: 100"``), ``extra`` adds lines under ``auth:`` (already indented two spaces)."""
    a_more = f", {a}" if a else ""
    b_more = f", {b}" if b else ""
    return (
        "auth:\n"
        "  keys:\n"
        f"    - {{name: team-a, key: {KEY_A}{a_more}}}\n"
        f"    - {{name: team-b, key_sha256: {KEY_B_SHA256}, models: ['mock-*']{b_more}}}\n" + extra
    )


MakeSecureGateway = Callable[..., Awaitable[RunningGateway]]


@pytest.fixture
async def secure_gateway(fake_upstream: FakeUpstream) -> AsyncIterator[MakeSecureGateway]:
    """``await secure_gateway(tail=..., server=...)``: the standard test gateway with ``tail``
    (top-level YAML such as :func:`auth_section` or ``caps:``) appended to its config."""
    runners: list[web.AppRunner] = []

    async def make(tail: str = "", **options: Any) -> RunningGateway:
        text = gateway_config_text(fake_upstream.url, **options) + tail
        app = create_app(parse_config(text, "<security test config>", env={}))
        runner, url = await serve_app(app)
        runners.append(runner)
        return RunningGateway(url, app, fake_upstream)

    try:
        yield make
    finally:
        for runner in reversed(runners):
            await runner.cleanup()


# --- the audit log -------------------------------------------------------------------------
class Lines(logging.Handler):
    """Every audit line written while installed, parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(orjson.loads(record.getMessage()))


@pytest.fixture
def audit_lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("gateway.audit")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


# --- redis-server ---------------------------------------------------------------------------
REDIS_MISSING = "redis-server is not installed (Debian package redis-server; .ci/run installs it)"


@dataclass
class RedisServer:
    port: int
    directory: Path
    password: str | None
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        assert exe is not None
        args = [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.directory)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start listening within 10 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def _redis_fixture(tmp_path: Path, password: str | None) -> Iterator[RedisServer]:
    if shutil.which("redis-server") is None:
        pytest.skip(REDIS_MISSING)
    server = RedisServer(free_port(), tmp_path, password)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    yield from _redis_fixture(tmp_path, None)


REDIS_PASSWORD = "redis-pass-5f1e9c2b7a"


@pytest.fixture
def redis_server_with_password(tmp_path: Path) -> Iterator[RedisServer]:
    yield from _redis_fixture(tmp_path, REDIS_PASSWORD)
