"""The spend tests share the security tests' gateways with ``auth:`` and their real redis-server."""

from tests.gateway.security.conftest import audit_lines, redis_server, secure_gateway

__all__ = ["audit_lines", "redis_server", "secure_gateway"]
