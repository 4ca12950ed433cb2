"""Gateways with ``auth:`` (the security tests' fixtures) and a real ``redis-server``."""

from tests.gateway.security.conftest import redis_server, secure_gateway

__all__ = ["redis_server", "secure_gateway"]
