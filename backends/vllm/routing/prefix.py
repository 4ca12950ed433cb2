"""Prompt-prefix block hashes, and the bounded LRU of them each worker keeps.

vLLM's prefix cache keys KV blocks by a hash chained over the prompt's leading
tokens. We cannot tokenize at the gateway, so we approximate with blocks of
``block_chars`` characters (text prompts) or ``block_tokens`` token ids (token
prompts), chained the same way: key *k* stands for the whole prefix up to block
*k*, so two prompts share key *k* only when their first *k* blocks are equal.
Only whole blocks count, as in vLLM; a prompt shorter than one block has no key.

Keys are 64-bit BLAKE2b digests, not Python's ``hash()`` (salted per process): the same
prompt gets the same keys in every gateway worker and every replica, which
``prefix-hash`` routing needs (each process must pick the same server on its own) and
which makes ``prefix-affinity`` reproducible. Text and token blocks hash under
different domain bytes, so a text never collides with a token list by construction.
Cost: one ``blake2b`` of at most ``block_chars`` bytes per block, ``max_blocks`` at most.

The LRU per worker is bounded by construction (``capacity`` keys; inserting past it
evicts the least recently used), so the index cannot grow with traffic.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from hashlib import blake2b
from typing import cast

import orjson

from schemas.chat import ChatCompletionRequest
from schemas.completions import CompletionRequest
from schemas.config import PoolRoutingConfig

__all__ = [
    "PrefixLRU",
    "block_keys",
    "chat_prefix_keys",
    "chat_prefix_text",
    "items_prefix_text",
    "prefix_keys",
    "request_keys",
]

_TEXT, _TOKENS = b"t", b"i"  # domain bytes: which kind of block a digest stands for


def prefix_keys(request: CompletionRequest, routing: PoolRoutingConfig) -> tuple[int, ...]:
    """Chained hashes of the leading whole blocks of the request's (first) prompt."""
    prompt = request.prompt
    first = prompt if isinstance(prompt, str) else prompt[0]
    if isinstance(first, (str, list)):
        return block_keys(first, routing)
    return block_keys(cast("list[int]", prompt), routing)


def request_keys(request: object, routing: PoolRoutingConfig) -> tuple[int, ...]:
    """The prefix keys of any request routing sees, by what its prompt's leading part is:

    completions: the (first) prompt; chat: the conversation (:func:`chat_prefix_text`); a request
    naming its own (``routing_text()``: embeddings' first input, rerank's query): that; a request
    with ``instructions`` and ``input`` (Responses): those, rendered as the same conversation in
    chat would be (:func:`items_prefix_text`), so both endpoints keep a conversation together.
    """
    if isinstance(request, CompletionRequest):
        return prefix_keys(request, routing)
    if isinstance(request, ChatCompletionRequest):
        return chat_prefix_keys(request, routing)
    if hasattr(request, "instructions") and hasattr(request, "input"):  # Responses
        return block_keys(items_prefix_text(request, routing.block_chars * routing.max_blocks), routing)
    routing_text = getattr(request, "routing_text", None)
    if callable(routing_text):  # embeddings, rerank: the first input, the query
        return block_keys(routing_text(), routing)
    return ()


def items_prefix_text(request: object, limit: int) -> str:
    """A Responses-shaped request's leading part (``instructions``, then ``input``: a string, or
    items with ``role`` and ``content``), rendered as :func:`chat_prefix_text` renders the same
    messages; other items by their sorted JSON. Empty for a request with neither."""
    parts: list[str] = []
    size = 0
    instructions = getattr(request, "instructions", None)
    if isinstance(instructions, str) and instructions:
        parts.append(f"\n<system>\n{instructions}")
        size += len(parts[-1])
    given = getattr(request, "input", None)
    items: list[object] = [{"role": "user", "content": given}] if isinstance(given, str) else list(given or [])
    for item in items:
        if size >= limit:
            break
        data = item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item
        if not isinstance(data, dict):
            continue
        content = data.get("content")
        if "role" in data and isinstance(content, str | list):
            if isinstance(content, list):
                content = "".join(
                    str(p.get("text", "")) if isinstance(p, dict) and "text" in p else orjson.dumps(p).decode()
                    for p in content
                )
            text = f"\n<{data['role']}>\n{content}"
        else:
            text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS, default=str).decode()
        parts.append(text)
        size += len(text)
    return "".join(parts)


def chat_prefix_keys(request: ChatCompletionRequest, routing: PoolRoutingConfig) -> tuple[int, ...]:
    """Chained hashes of the leading whole blocks of the conversation (:func:`chat_prefix_text`)."""
    return block_keys(chat_prefix_text(request, routing.block_chars * routing.max_blocks), routing)


def chat_prefix_text(request: ChatCompletionRequest, limit: int) -> str:
    """The conversation's leading part as text, at least ``limit`` characters when it is that long.

    The tools lead (a chat template renders them into the system prompt), then each message
    as ``role``, name and content (text parts joined; other parts by their JSON) and its tool
    calls. Not the server's template, but the same conversation prefix always renders to
    the same text, and a conversation that grows keeps its leading blocks, which is all
    routing needs. Rendering stops once ``limit`` characters exist (only whole blocks count).
    """
    parts: list[str] = []
    size = 0
    if request.tools:
        text = orjson.dumps([tool.model_dump(exclude_none=True, by_alias=True) for tool in request.tools]).decode()
        parts.append(text)
        size += len(text)
    for message in request.messages:
        if size >= limit:
            break
        data = message.model_dump(exclude_none=True, by_alias=True)
        content = data.pop("content", None)
        if isinstance(content, list):
            content = "".join(
                part["text"] if part.get("type") == "text" else orjson.dumps(part).decode() for part in content
            )
        head = f"\n<{data.pop('role', '')}{':' + data.pop('name') if 'name' in data else ''}>\n"
        rest = orjson.dumps(data, option=orjson.OPT_SORT_KEYS).decode() if data else ""
        text = head + (content or "") + rest
        parts.append(text)
        size += len(text)
    return "".join(parts)


def block_keys(prefix: str | Sequence[int], routing: PoolRoutingConfig) -> tuple[int, ...]:
    """Chained hashes of the leading whole blocks of a text or of a token-id sequence.

    The one key function for every caller (completions' prompts, a chat conversation's
    leading part): equal leading blocks give equal keys in every process.
    """
    if isinstance(prefix, str):
        return _chain(prefix, routing.block_chars, routing.max_blocks)
    return _chain(prefix, routing.block_tokens, routing.max_blocks)


def _chain(seq: str | Sequence[int], size: int, max_blocks: int) -> tuple[int, ...]:
    blocks = min(len(seq) // size, max_blocks)
    keys: list[int] = []
    previous = b""
    for i in range(blocks):
        block = seq[i * size : (i + 1) * size]
        if isinstance(block, str):
            # surrogatepass: a lone surrogate (valid JSON escape) must hash, not raise.
            data = _TEXT + block.encode("utf-8", "surrogatepass")
        else:
            data = _TOKENS + b",".join(str(t).encode() for t in block)  # ids are unbounded ints
        previous = blake2b(previous + data, digest_size=8).digest()
        keys.append(int.from_bytes(previous, "big"))
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
