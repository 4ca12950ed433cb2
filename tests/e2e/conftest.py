"""The pooling gateway's fixtures (``tests.e2e.pooling_gateway``) for every e2e module."""

from tests.e2e.pooling_gateway import make_pooling, pooling, pooling_upstream

__all__ = ["make_pooling", "pooling", "pooling_upstream"]
