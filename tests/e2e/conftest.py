"""Fixtures for every e2e module: the pooling gateway (``tests.e2e.pooling_gateway``) and the Responses
gateway over simulated servers of every backend type (``tests.e2e.model_upstreams``)."""

from tests.e2e.model_upstreams import resp_client, resp_gateway
from tests.e2e.pooling_gateway import make_pooling, pooling, pooling_upstream

__all__ = ["make_pooling", "pooling", "pooling_upstream", "resp_client", "resp_gateway"]
