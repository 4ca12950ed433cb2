"""What the request guard is built with decides which per-request steps the handler runs.

The handler skips ``identify`` when there is no keyring and ``reserve`` when there is no
limit store (issue 12: no call that returns at once on every request), so these are the
setup-time facts it relies on: each one set exactly when its feature is configured.
"""

from __future__ import annotations

import pytest

from gateway.configfile import parse_config
from gateway.metrics import GatewayMetrics
from gateway.security.guard import RequestGuard
from tests.conftest import gateway_config_text
from tests.gateway.security.conftest import auth_section


def _guard(extra: str = "", server: str = "") -> RequestGuard:
    config = parse_config(gateway_config_text("http://127.0.0.1:9", server=server) + extra)
    return RequestGuard.from_config(config, GatewayMetrics([m.name for m in config.models], ["b"]))


def test_auth_off_builds_no_keyring_no_store_no_audit() -> None:
    guard = _guard()
    assert guard.keyring is None and guard.store is None and guard.audit is None
    assert not guard.caps.any


def test_keys_without_limits_build_a_keyring_but_no_store() -> None:
    guard = _guard(auth_section())
    assert guard.keyring is not None and guard.store is None


@pytest.mark.parametrize("limits", ["rpm: 2", "tpm: 100", "max_concurrent: 1"])
def test_any_key_limit_builds_the_store(limits: str) -> None:
    guard = _guard(auth_section(b=limits))
    assert guard.keyring is not None and guard.store is not None


def test_audit_log_on_builds_the_audit_log() -> None:
    assert _guard(server="audit_log: true").audit is not None
