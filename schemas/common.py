"""What the two request schemas share: bounded types and the rules both endpoints apply.

``/v1/completions`` (:mod:`schemas.completions`) and ``/v1/chat/completions``
(:mod:`schemas.chat`) take many of the same sampling fields. Their types and the rules
that tie them are defined here once, so both endpoints refuse the same input with the
same message and ``param``. The rules are plain functions that raise
:class:`~schemas.errors.FieldRuleError`; each request model calls them from its own
named ``model_validator`` (validator order, and so which error wins, stays per model).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import AfterValidator, BaseModel, Field, StrictInt, TypeAdapter
from pydantic_core import SchemaSerializer

from schemas.errors import FieldRuleError

__all__ = [
    "CHARS_PER_TOKEN",
    "GUIDED_FIELDS",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_STOP_SEQUENCES",
    "Answered",
    "ChoiceCount",
    "Count",
    "CountOrMinusOne",
    "FieldDumps",
    "FieldRules",
    "GuidedChoice",
    "Int64",
    "JsonObject",
    "LogitBias",
    "NonEmpty",
    "Penalty",
    "PositiveFloat",
    "Stop",
    "Temperature",
    "TokenId",
    "UnitInterval",
    "check_guides",
    "check_logit_bias_keys",
    "check_stream_options",
]

CHARS_PER_TOKEN = 4  # the gateway cannot tokenize: ~4 characters per token, for estimates only
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
MAX_STOP_SEQUENCES = 4
GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")
# The widest integer the upstream serialiser (orjson) writes: beyond it a request would fail
# on its way out (a 500), so arbitrary JSON values are bounded to it at the door.
_JSON_INT_MIN, _JSON_INT_MAX = INT64_MIN, 2**64 - 1

# Every integer field is bounded (int64): Python ints are unbounded, the wire and the
# upstreams are not. Per-backend bounds (e.g. logprobs) are in the capability tables.
Int64 = Annotated[StrictInt, Field(ge=INT64_MIN, le=INT64_MAX)]
Count = Annotated[StrictInt, Field(ge=0, le=INT64_MAX)]
TokenId = Count
NonEmpty = Annotated[str, Field(min_length=1)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
UnitInterval = Annotated[float, Field(ge=0.0, le=1.0)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
ChoiceCount = Annotated[StrictInt, Field(ge=1, le=128)]  # n
CountOrMinusOne = Annotated[StrictInt, Field(ge=-1, le=INT64_MAX)]  # vLLM extras: -1 means "all" (top_k: no limit)
Stop = NonEmpty | Annotated[list[NonEmpty], Field(min_length=1, max_length=MAX_STOP_SEQUENCES)]
LogitBias = dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]]
GuidedChoice = Annotated[list[NonEmpty], Field(min_length=1)]


def _json_safe(value: Any) -> Any:
    """Refuse what cannot be re-serialised faithfully: integers orjson cannot write, and
    non-finite floats (JSON has none; orjson would write ``null``, changing the meaning).

    Depth needs no check here: pydantic's JSON parser refuses deep nesting (limit 200)
    before orjson's own (254) could be reached.

    Parsed JSON holds only ``dict``, ``list``, ``str``, ``int``, ``float``, ``bool`` and None: each
    node is read once by its exact type, with no call per node (a tool's JSON Schema has hundreds;
    issue 21). Anything else (a subclass, another type, a value out of range) is decided by
    :func:`_json_safe_walk`, the walk by ``isinstance``, so the answer and its error are the same.
    """
    todo = [value]
    for item in todo:  # the list grows as it is read: every node once
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is dict:
            todo += item.values()
        elif kind is list:
            todo += item
        elif kind is int:
            if not _JSON_INT_MIN <= item <= _JSON_INT_MAX:
                return _json_safe_walk(value)
        elif kind is not float or item - item != 0.0:  # inf - inf and nan - nan are nan
            return _json_safe_walk(value)
    return value


def _json_safe_walk(value: Any) -> Any:
    """:func:`_json_safe` by ``isinstance`` (subclasses too), raising for the first value refused."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool) or item is None or isinstance(item, str):
            continue
        if isinstance(item, int):
            if not _JSON_INT_MIN <= item <= _JSON_INT_MAX:
                raise ValueError(f"integer {item} is out of range (-2^63 to 2^64-1)")
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError("numbers must be finite (no NaN or Infinity)")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return value


# A JSON object whose numbers survive re-serialisation (a JSON Schema, for instance).
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_safe)]


def check_logit_bias_keys(logit_bias: dict[str, float] | None) -> None:
    for key in logit_bias or ():
        # str.isdigit() alone accepts superscripts and non-ASCII digits; the length
        # bound keeps int(key) inside int64 for the upstreams that take numbers.
        if not (key.isascii() and key.isdigit() and len(key) <= 19 and int(key) <= INT64_MAX):
            raise FieldRuleError(
                "logit_bias", f"logit_bias keys must be token ids (non-negative integers as strings); got {key!r}"
            )


def check_stream_options(stream_options: object | None, stream: bool | None) -> None:
    if stream_options is not None and not stream:
        raise FieldRuleError("stream_options", "stream_options is only allowed when stream is true")


def check_guides(
    constraints: Sequence[str], *, guided_json: object, whitespace_pattern: object, decoding_backend: object
) -> None:
    """One output constraint at a time (``constraints``: the names set, in field order), and the
    two ``guided_*`` options that only mean something next to a guide."""
    if len(constraints) > 1:
        raise FieldRuleError(
            constraints[1], f"only one structured-output constraint may be set; got {', '.join(constraints)}"
        )
    if whitespace_pattern is not None and guided_json is None:
        raise FieldRuleError("guided_whitespace_pattern", "guided_whitespace_pattern only applies with guided_json")
    if decoding_backend is not None and not any(name in GUIDED_FIELDS for name in constraints):
        raise FieldRuleError(
            "guided_decoding_backend",
            "guided_decoding_backend needs one of guided_json, guided_regex, guided_choice or guided_grammar",
        )


_Model = TypeVar("_Model")


_MAX_CHOSEN = 1024  # sets of touched rule fields kept per model: a bound on memory, not a tuning knob


class FieldRules(Generic[_Model]):
    """A request model's cross-field rules, in order, each with the fields without which it cannot
    fail (the first rule broken is the error).

    :meth:`run` calls a rule only when one of its fields was set (an unset field is its default,
    which breaks no rule), so a plain request pays for one set intersection: the request path's
    cost (issue 14). Which rules a set of touched fields calls is worked out once per set and
    kept (a few per model in practice; past 1,024 sets, worked out each time).
    Shared by the request schemas.
    """

    __slots__ = ("_chosen", "_fields", "_rules")

    def __init__(self, *rules: tuple[frozenset[str], Callable[[_Model], None]]) -> None:
        self._rules = rules
        self._fields: frozenset[str] = frozenset().union(*(fields for fields, _ in rules))
        self._chosen: dict[frozenset[str], tuple[Callable[[_Model], None], ...]] = {}

    def __iter__(self) -> Iterator[tuple[frozenset[str], Callable[[_Model], None]]]:
        return iter(self._rules)

    def run(self, model: _Model, fields_set: set[str]) -> None:
        touched = fields_set & self._fields
        if touched:
            key = frozenset(touched)
            try:
                chosen = self._chosen[key]
            except KeyError:
                chosen = tuple(rule for fields, rule in self._rules if not touched.isdisjoint(fields))
                if len(self._chosen) < _MAX_CHOSEN:
                    self._chosen[key] = chosen
            for rule in chosen:
                rule(model)


class Answered:
    """The request path's common interface (``gateway.served.ServedRequest``) of a request that
    generates nothing (embeddings, rerank, the tokenizer): one pass, no choices, no output limit.
    A mixin of class attributes; each model adds ``output_limit_param`` (the field errors name)."""

    stream: ClassVar[None] = None
    n: ClassVar[None] = None
    best_of: ClassVar[None] = None
    sequences: ClassVar[int] = 1
    prompt_count: ClassVar[int] = 1  # a batch is answered by one pass, not multiplied like choices
    prompt_array: ClassVar[None] = None  # each schema bounds its own arrays
    output_limit: ClassVar[int] = 0
    output_limit_set: ClassVar[bool] = False
    output_bounded: ClassVar[bool] = True
    include_usage: ClassVar[bool] = False


class FieldDumps:
    """The serializers of one request model's fields, for dumping only the fields a client set.

    A model's own serializer walks all of its declared fields on every call (~60 on chat and
    Responses); a request sets a handful. ``order`` is each field's place in the declared order;
    :meth:`serializer` builds a field's serializer on first use (most fields never need one).
    """

    __slots__ = ("_model", "_serializers", "order")

    def __init__(self, model: type[BaseModel]) -> None:
        self._model = model
        self.order: dict[str, int] = {name: i for i, name in enumerate(model.model_fields)}
        self._serializers: dict[str, SchemaSerializer] = {}

    def serializer(self, name: str) -> SchemaSerializer:
        serializer = self._serializers.get(name)
        if serializer is None:
            info = self._model.model_fields[name]
            kind: Any = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
            serializer = self._serializers[name] = TypeAdapter(kind).serializer
        return serializer
