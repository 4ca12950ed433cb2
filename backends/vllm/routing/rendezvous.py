"""Rendezvous (highest random weight) hashing: every process ranks servers alike for a key.

A server's weight for a key is ``blake2b(key bytes + server id)``; the id is the server's URL
(``Endpoint.hash_id``), the same in every gateway process and replica that knows the server by it.
When a server joins or leaves, only the keys it wins or held move.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b
from typing import Protocol, TypeVar

__all__ = ["Named", "rendezvous_first", "rendezvous_order"]


class Named(Protocol):
    @property
    def hash_id(self) -> bytes: ...


N = TypeVar("N", bound=Named)


def _weight(prefix: bytes, ep: Named) -> bytes:
    return blake2b(prefix + ep.hash_id, digest_size=8).digest()


def rendezvous_order(endpoints: Sequence[N], key: int) -> list[N]:
    """``endpoints`` by rendezvous weight for ``key``, highest first (stable across processes)."""
    prefix = key.to_bytes(8, "big")
    return sorted(endpoints, key=lambda ep: _weight(prefix, ep), reverse=True)


def rendezvous_first(endpoints: Sequence[N], key: int) -> N:
    """The first of :func:`rendezvous_order` without sorting (``endpoints`` not empty)."""
    prefix = key.to_bytes(8, "big")
    return max(endpoints, key=lambda ep: _weight(prefix, ep))
