"""A prompt's KV-cache block hashes, computed exactly as vLLM 0.32 computes them.

vLLM (``vllm/v1/core/kv_cache_utils.py``, ``hash_block_tokens``): the prompt's token ids are cut
into full blocks of ``block_size``; block *i*'s hash is ``hash_fn((parent, tuple(ids), extra))``,
``parent`` being block *i-1*'s hash, or ``NONE_HASH`` for the first, and ``extra`` ``None`` for a
plain text request (LoRA, multimodal inputs, ``cache_salt`` and prompt embeddings add keys: such
requests are not matched). ``hash_fn`` is ``--prefix-caching-hash-algo``: ``sha256`` (the default:
SHA-256 of the pickle, highest protocol), ``sha256_cbor`` (of canonical CBOR; needs ``cbor2``),
``xxhash`` / ``xxhash_cbor`` (XXH3-128; needs ``xxhash``). ``NONE_HASH = hash_fn(seed)``, the seed
being the server's ``PYTHONHASHSEED`` when set, else ``"vllm-none-hash"`` for the SHA-256 kinds
and random bytes for the xxhash kinds (which then cannot be matched from outside).

KV events carry each hash as an int, the hash's low 64 bits (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``,
on by default), or as the bytes: :func:`event_key` maps either to that int, the index's key.
``pickle.dumps`` here only serialises our own tuple of bytes and ints (nothing is unpickled).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ALGORITHMS", "BlockHasher", "event_key", "hasher_for"]

DEFAULT_SEED = "vllm-none-hash"
_LOW64 = (1 << 64) - 1


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    import cbor2  # optional: only for servers started with --prefix-caching-hash-algo sha256_cbor

    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    import xxhash  # optional

    digest: bytes = xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    return digest


def _xxhash_cbor(obj: Any) -> bytes:
    import cbor2
    import xxhash

    digest: bytes = xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))
    return digest


# name -> (hash function, seeded without PYTHONHASHSEED: True for the cryptographic ones)
ALGORITHMS: dict[str, tuple[Callable[[Any], bytes], bool]] = {
    "sha256": (_sha256, True),
    "sha256_cbor": (_sha256_cbor, True),
    "xxhash": (_xxhash, False),
    "xxhash_cbor": (_xxhash_cbor, False),
}


def event_key(value: object) -> int | None:
    """The index key of a block hash as a KV event carries it (int or bytes); None if neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & _LOW64
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(value, "big") & _LOW64
    return None


class BlockHasher:
    """The block hashes of token ids as one server configuration computes them. Immutable; thread-safe."""

    __slots__ = ("_fn", "_none", "algo", "block_size")

    def __init__(self, block_size: int, algo: str, fn: Callable[[Any], bytes], seed: str) -> None:
        self.block_size = block_size
        self.algo = algo
        self._fn = fn
        self._none = fn(seed)

    def keys(self, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """The index keys (:func:`event_key`) of the leading full blocks, at most ``max_blocks``."""
        size = self.block_size
        fn = self._fn
        parent = self._none
        out: list[int] = []
        for start in range(0, min(len(token_ids) // size, max_blocks) * size, size):
            parent = fn((parent, tuple(token_ids[start : start + size]), None))
            out.append(int.from_bytes(parent, "big") & _LOW64)
        return out


def hasher_for(block_size: int, algo: str, seed: str | None) -> BlockHasher | str:
    """The hasher for a server (``seed``: its ``PYTHONHASHSEED``, None when unset), or why there is none."""
    if block_size <= 0:
        return "the server's block size is not known yet (vllm:cache_config_info)"
    name = algo or "sha256"
    entry = ALGORITHMS.get(name)
    if entry is None:
        return f"unknown prefix_caching_hash_algo {name!r}"
    fn, seeded = entry
    if seed is None and not seeded:
        return f"{name} without PYTHONHASHSEED hashes with a random seed per server"
    try:
        return BlockHasher(block_size, name, fn, seed if seed is not None else DEFAULT_SEED)
    except ImportError as exc:
        return f"{name} needs {exc.name}"
