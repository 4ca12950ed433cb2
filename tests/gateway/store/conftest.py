"""The state-store tests reuse the security tests' real ``redis-server`` fixtures."""

from tests.gateway.security.conftest import redis_server, redis_server_with_password

__all__ = ["redis_server", "redis_server_with_password"]
