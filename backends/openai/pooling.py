"""The OpenAI family's embeddings and rerank translator (also under vLLM's: ``backends.vllm.pooling``);
its tables are in ``backends.openai.capabilities``.

Embeddings (``POST {base_url}/embeddings``): the request as the client sent it (fields set,
nulls dropped, neutral values of unsupported fields dropped), ``model`` mapped to the route's;
the answer relayed as the upstream's bytes with only the model swapped (``relay_completion_body``),
its ``usage.prompt_tokens`` read for accounting.

Rerank (``POST {base_url}/rerank``, the Jina/Cohere shape many OpenAI-compatible servers serve):
``query``, ``documents`` as strings (objects sent as their text), ``top_n``; the answer read in
any of the servers' shapes and written in ours (``backends.emulation.rerank``). OpenAI's own API
has no rerank: a model is served on it only when its config lists ``rerank``.
"""

from __future__ import annotations

from typing import Any

import orjson

from backends.base import CompletionResult, EmbeddingCall, RerankCall, TokenUsage
from backends.emulation.rerank import rerank_answer, upstream_scores
from backends.errors import UpstreamProtocolError
from backends.exact_json import dumps_exact, loads_keeping_integers
from backends.openai.body import relay_completion_body
from backends.pooling_capabilities import PoolingCapabilities

__all__ = ["embedding_payload", "pooling_usage", "relay_embeddings", "rerank_payload", "rerank_result"]

_MAX_COUNT = 1 << 32


def pooling_usage(obj: Any) -> TokenUsage | None:
    """An embeddings or rerank ``usage``: ``prompt_tokens`` (or only ``total_tokens``, as Jina), a count."""
    if type(obj) is not dict:
        return None
    tokens = obj.get("prompt_tokens", obj.get("total_tokens"))
    if type(tokens) is int and 0 <= tokens < _MAX_COUNT:
        return TokenUsage(tokens, 0)
    return None


def embedding_payload(call: EmbeddingCall, table: PoolingCapabilities) -> dict[str, Any]:
    """The upstream body: the client's fields, ``model`` mapped, neutral values of unsupported fields dropped."""
    fields = call.request.upstream_fields()
    table.strip_neutral(fields)
    fields["model"] = call.upstream_model
    return fields


def relay_embeddings(data: bytes, call: EmbeddingCall, backend: str) -> CompletionResult:
    """The upstream's list object with only the model swapped; its usage read.

    The vectors are not parsed (:func:`_relayed_unparsed`: most of an answer's bytes and of its
    parse); a body that the skeleton's checks do not vouch for takes the full parse, which names
    what is wrong with it (``relay_completion_body``).
    """
    relayed = _relayed_unparsed(data, call.public_model)
    if relayed is not None:
        return relayed
    result = relay_completion_body(data, call, backend, "list", items="data", read_usage=pooling_usage)
    return _in_input_order(result, backend)


def _in_input_order(result: CompletionResult, backend: str) -> CompletionResult:
    """An answer whose ``data`` items carry the indices 0..n-1 out of order, sorted by index
    (``data[].index`` is in input order, whatever the server did); any other answer as it is."""
    obj = loads_keeping_integers(result.body, backend)
    items = obj["data"]
    indices = [i for item in items if type(item) is dict and type(i := item.get("index")) is int]
    in_order = list(range(len(items)))
    if indices == in_order or sorted(indices) != in_order:  # in order, or not the indices 0..n-1
        return result
    obj["data"] = sorted(items, key=lambda item: item["index"])
    return CompletionResult(dumps_exact(obj, backend), result.usage)


_VECTOR_KEY = b'"embedding":'


def _relayed_unparsed(data: bytes, public: str) -> CompletionResult | None:
    """The answer relayed without parsing its vectors, or None where that is not provably right.

    Each ``"embedding":`` value is cut out: a float array up to its first ``]`` holding no ``"``,
    ``[``, ``{`` or ``}`` (so nothing but scalars), or a base64 string up to its closing quote with
    no escape. What is left, the skeleton, is parsed: a list object whose ``data`` items are exactly
    the cut vectors, ``index`` 0..n-1 in order, each one ``embedding``; its ``usage`` is the
    answer's. The model is swapped where the skeleton's only ``"model"`` token is: a cut value holds
    no quote, so it is the body's only one too (the argument of ``relay_completion_body``). The
    bytes inside a float array are relayed unread: a number spelt wrong there reaches the client as
    sent, as inside a relayed stream event (docs/security.md); a body cut short fails the framing.
    """
    find = data.find
    pieces: list[bytes] = []
    starts: list[int] = []  # where each piece of the skeleton starts in ``data``
    pos = 0
    while (at := find(_VECTOR_KEY, pos)) >= 0:
        start = at + 12
        if data[start : start + 1] == b" ":  # ": [" (Python's json.dumps spacing)
            start += 1
        opener = data[start : start + 1]
        if opener == b"[":
            end = find(b"]", start)
            if end < 0 or find(b'"', start, end) >= 0 or find(b"{", start, end) >= 0:
                return None
            if find(b"[", start + 1, end) >= 0 or find(b"}", start, end) >= 0:
                return None
        elif opener == b'"':
            end = find(b'"', start + 1)
            if end < 0 or find(b"\\", start, end) >= 0:
                return None
        else:
            return None
        pieces.append(data[pos : start + 1])
        starts.append(pos)
        pos = end
    if not pieces:
        return None
    pieces.append(data[pos:])
    starts.append(pos)
    skeleton = b"".join(pieces)
    try:
        obj = orjson.loads(skeleton)
    except orjson.JSONDecodeError:
        return None
    items = obj.get("data") if type(obj) is dict else None
    if type(items) is not list or len(items) != len(pieces) - 1:
        return None
    for i, item in enumerate(items):
        if type(item) is not dict or type(index := item.get("index")) is not int or index != i:
            return None
        if item.get("embedding") not in ([], ""):
            return None
    upstream = obj.get("model")
    at = skeleton.find(b'"model"')
    if type(upstream) is not str or at < 0 or skeleton.rfind(b'"model"') != at or b"\\u006" in skeleton:
        return None
    # The piece holding the token, and where it is in ``data``.
    piece, offset = 0, at
    while offset >= len(pieces[piece]):
        offset -= len(pieces[piece])
        piece += 1
    at = starts[piece] + offset
    value = orjson.dumps(upstream)
    start = at + 8  # past '"model":'
    if data[start : start + 1] == b" ":
        start += 1
    if not data.startswith(b'"model":', at) or not data.startswith(value, start):
        return None
    view = memoryview(data)  # one copy of a batch's megabytes, not three
    body = b"".join((view[:start], orjson.dumps(public), view[start + len(value) :]))
    return CompletionResult(body, pooling_usage(obj.get("usage")))


def rerank_payload(call: RerankCall, table: PoolingCapabilities) -> dict[str, Any]:
    """The upstream body: documents as strings; ``return_documents`` is the gateway's to apply."""
    request = call.request
    fields = request.model_dump(exclude_none=True, exclude_unset=True)
    fields.pop("return_documents", None)
    table.strip_neutral(fields)
    fields["model"] = call.upstream_model
    fields["documents"] = request.texts
    return fields


def rerank_result(data: bytes, call: RerankCall, backend: str) -> CompletionResult:
    """An upstream rerank answer (vLLM, Jina, Cohere shapes) as ours; usage estimated when it has none."""
    request = call.request
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError("the upstream sent a body that is not JSON", backend=backend) from None
    if not isinstance(obj, dict):
        raise UpstreamProtocolError("the upstream sent a rerank answer that is not an object", backend=backend)
    scores = upstream_scores(obj.get("results"), len(request.documents), backend)
    usage = pooling_usage(obj.get("usage")) or TokenUsage(request.prompt_estimate(), 0)
    upstream_id = obj.get("id")
    answer_id = upstream_id if isinstance(upstream_id, str) else f"rerank-{call.request_id}"
    return rerank_answer(scores, request, call.public_model, answer_id, usage)
