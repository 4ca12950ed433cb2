"""Prompt-prefix block hashes, and the bounded LRU of them each worker keeps.

vLLM's prefix cache keys KV blocks by a hash chained over the prompt's leading
tokens. We cannot tokenize at the gateway, so we approximate with blocks of
``block_chars`` characters (text prompts) or ``block_tokens`` token ids (token
prompts), chained the same way: key *k* stands for the whole prefix up to block
*k*, so two prompts share key *k* only when their first *k* blocks are equal.
Only whole blocks count, as in vLLM; a prompt shorter than one block has no key.

The LRU per worker is bounded by construction (``capacity`` keys; inserting past it
evicts the least recently used), so the index cannot grow with traffic.
Hashes are Python's (salted per process): they only need to agree within one gateway.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import cast

from schemas.completions import CompletionRequest
from schemas.config import PoolRoutingConfig

__all__ = ["PrefixLRU", "prefix_keys"]


def prefix_keys(request: CompletionRequest, routing: PoolRoutingConfig) -> tuple[int, ...]:
    """Chained hashes of the leading whole blocks of the request's (first) prompt."""
    prompt = request.prompt
    first = prompt if isinstance(prompt, str) else prompt[0]
    if isinstance(first, str):
        return _chain(first, routing.block_chars, routing.max_blocks)
    if isinstance(first, list):
        return _chain(first, routing.block_tokens, routing.max_blocks)
    return _chain(cast("list[int]", prompt), routing.block_tokens, routing.max_blocks)


def _chain(seq: str | Sequence[int], size: int, max_blocks: int) -> tuple[int, ...]:
    blocks = min(len(seq) // size, max_blocks)
    keys: list[int] = []
    h = 0
    for i in range(blocks):
        block = seq[i * size : (i + 1) * size]
        h = hash((h, block if isinstance(block, str) else tuple(block)))
        keys.append(h)
    return tuple(keys)


class PrefixLRU:
    """At most ``capacity`` prefix keys, least recently used evicted first. Not thread-safe."""

    __slots__ = ("_keys", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, key: int) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, keys: Iterable[int]) -> None:
        """Insert (or refresh) keys; the last one given ends up most recently used."""
        entries = self._keys
        for key in keys:
            if key in entries:
                entries.move_to_end(key)
            else:
                entries[key] = None
                if len(entries) > self.capacity:
                    entries.popitem(last=False)

    def clear(self) -> None:
        self._keys.clear()
