"""A real ``redis-server`` (the security tests' fixture): the conversation store workers share."""

from tests.gateway.security.conftest import redis_server

__all__ = ["redis_server"]
