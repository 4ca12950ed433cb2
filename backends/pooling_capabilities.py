"""Which embeddings and rerank fields (and which forms of them) a backend can honour, as frozen data.

One table type for both pooling endpoints, shaped like the chat tables
(:mod:`backends.chat_capabilities`): a level per field of the endpoint's schema
(native / translated / emulated / unsupported), levels for the *forms* of a value keyed
``"field=form"`` (``input=token_ids``, ``encoding_format=base64``, ``documents=object``), the
reasons quoted when something is refused, notes on how a field is honoured where the level alone
does not say, and value rules (:class:`PoolingRule`: a per-backend bound such as OpenAI's 8,192
tokens per input). Each family builds its tables in its own folder; the router checks a request
against its route's table before routing (:meth:`PoolingCapabilities.refusal`), and the refusal is
the one 400 ``unsupported_parameter`` every endpoint builds (:meth:`Capabilities.refusal_error`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from functools import cached_property
from types import MappingProxyType
from typing import Any

from backends.capabilities import Capabilities, Level
from schemas.embeddings import EMBEDDING_NEUTRAL_VALUES, EmbeddingRequest, input_kind
from schemas.errors import UnsupportedParameterError
from schemas.rerank import RERANK_NEUTRAL_VALUES, RerankRequest

__all__ = [
    "BINARY_REASON",
    "EMBEDDING_FIELDS",
    "RERANK_FIELDS",
    "PoolingCapabilities",
    "PoolingRule",
    "embedding_forms",
    "embedding_table",
    "rerank_forms",
    "rerank_table",
]

EMBEDDING_FIELDS: tuple[str, ...] = tuple(EmbeddingRequest.model_fields)
RERANK_FIELDS: tuple[str, ...] = tuple(RerankRequest.model_fields)

Forms = Callable[[Any], Iterator[tuple[str, str]]]
# Why ``encoding_format`` ``bytes`` / ``bytes_only`` is refused everywhere but on vLLM.
BINARY_REASON = "binary answers (application/octet-stream) are vLLM's"


def embedding_forms(request: EmbeddingRequest) -> Iterator[tuple[str, str]]:
    """``(field, form)`` for the value forms an embeddings request uses."""
    if request.input is not None:
        yield "input", input_kind(request)
    elif request.batched_messages:
        yield "messages", "batch"
    if request.encoding_format is not None:
        yield "encoding_format", request.encoding_format


def rerank_forms(request: RerankRequest) -> Iterator[tuple[str, str]]:
    """``(field, form)`` for the value forms a rerank request uses."""
    if any(not isinstance(d, str) for d in request.documents):
        yield "documents", "object"


@dataclass(frozen=True, slots=True)
class PoolingRule:
    """A refusal that depends on a field's value: ``applies(request)`` -> refuse ``field`` saying ``why``."""

    field: str
    why: str
    applies: Callable[[Any], bool]


@dataclass(frozen=True)
class PoolingCapabilities:
    """A backend's table for one pooling endpoint; build with :func:`embedding_table` or :func:`rerank_table`."""

    fields: tuple[str, ...]
    levels: Mapping[str, Level]
    forms: Mapping[str, Level]
    neutral: Mapping[str, tuple[Any, ...]]
    forms_of: Forms
    reasons: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    notes: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    rules: tuple[PoolingRule, ...] = ()

    @cached_property
    def unsupported(self) -> frozenset[str]:
        """The unsupported fields (computed once: every request's check reads it)."""
        return frozenset(name for name, level in self.levels.items() if level is Level.UNSUPPORTED)

    def level(self, field: str, form: str | None = None) -> Level:
        if form is not None and (level := self.forms.get(f"{field}={form}")) is not None:
            return level
        return self.levels[field]

    def note(self, field: str, form: str | None = None) -> str | None:
        return self.notes.get(field if form is None else f"{field}={form}")

    def with_changes(
        self,
        levels: Mapping[str, Level] | None = None,
        forms: Mapping[str, Level] | None = None,
        reasons: Mapping[str, str] | None = None,
    ) -> PoolingCapabilities:
        """The same table with some levels, forms and reasons replaced (a vLLM version's table)."""
        return replace(
            self,
            levels=MappingProxyType({**self.levels, **(levels or {})}),
            forms=MappingProxyType({**self.forms, **(forms or {})}),
            reasons=MappingProxyType({**self.reasons, **(reasons or {})}),
        )

    def first_refusal(self, request: Any) -> tuple[str, str, str | None] | None:
        """``(param, key, why)`` for the first thing the request asks that this backend cannot honour.

        Order: unsupported fields (schema order) unless set to their neutral value, then forms,
        then value rules. Cost: a set intersection, one short walk over the request's forms.
        """
        fields_set = request.model_fields_set
        touched = self.unsupported.intersection(fields_set)
        if touched:
            for name in self.fields:
                if name in touched:
                    value = getattr(request, name)
                    if value is not None and value not in self.neutral.get(name, ()):
                        return name, name, self.reasons.get(name)
        for name, form in self.forms_of(request):
            key = f"{name}={form}"
            if self.forms.get(key) is Level.UNSUPPORTED:
                return name, key, self.reasons.get(key)
        for rule in self.rules:
            if rule.applies(request):
                return rule.field, rule.field, rule.why
        return None

    def refusal(self, request: Any, backend: str, kind: str) -> UnsupportedParameterError | None:
        """The 400 for the first thing this backend cannot honour (None: it can serve the request)."""
        found = self.first_refusal(request)
        if found is None:
            return None
        param, key, why = found
        what = None
        if "=" in key:
            name, form = key.split("=", 1)
            what = f'{name} "{form}"' if name != "input" else f"{name} as {form.replace('_', ' ')}"
        return Capabilities.refusal_error(param, backend, kind, why, what=what)

    def strip_neutral(self, fields: dict[str, Any]) -> None:
        """Drop from an upstream body (in place) the unsupported fields the client set to "off"."""
        for name in self.unsupported.intersection(fields):
            del fields[name]

    def rows(self) -> Iterator[tuple[str, Level]]:
        """Every field, then every form, with its level (for the capability matrix)."""
        for name in self.fields:
            yield name, self.levels[name]
        yield from sorted(self.forms.items())


def _build(
    all_fields: tuple[str, ...],
    neutral: Mapping[str, tuple[Any, ...]],
    forms_of: Forms,
    default: Level,
    levels: Mapping[str, Level],
    forms: Mapping[str, Level] | None,
    reasons: Mapping[str, str] | None,
    notes: Mapping[str, str] | None,
    rules: Iterable[PoolingRule],
) -> PoolingCapabilities:
    keys = set(levels) | {k.split("=")[0] for k in (forms or {})} | {k.split("=")[0] for k in (notes or {})}
    unknown = keys - set(all_fields)
    if unknown:
        raise ValueError(f"unknown request fields: {sorted(unknown)}")
    return PoolingCapabilities(
        all_fields,
        MappingProxyType({name: levels.get(name, default) for name in all_fields}),
        MappingProxyType(dict(forms or {})),
        MappingProxyType(dict(neutral)),
        forms_of,
        MappingProxyType(dict(reasons or {})),
        MappingProxyType(dict(notes or {})),
        tuple(rules),
    )


def embedding_table(
    default: Level,
    levels: Mapping[str, Level],
    forms: Mapping[str, Level] | None = None,
    *,
    reasons: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
    rules: Iterable[PoolingRule] = (),
) -> PoolingCapabilities:
    """An embeddings table: ``levels`` per field (others ``default``), ``forms`` such as ``input=token_ids``."""
    return _build(
        EMBEDDING_FIELDS, EMBEDDING_NEUTRAL_VALUES, embedding_forms, default, levels, forms, reasons, notes, rules
    )


def rerank_table(
    default: Level,
    levels: Mapping[str, Level],
    forms: Mapping[str, Level] | None = None,
    *,
    reasons: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
    rules: Iterable[PoolingRule] = (),
) -> PoolingCapabilities:
    """A rerank table: ``levels`` per field (others ``default``), ``forms`` such as ``documents=object``."""
    return _build(RERANK_FIELDS, RERANK_NEUTRAL_VALUES, rerank_forms, default, levels, forms, reasons, notes, rules)
