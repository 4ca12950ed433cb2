"""Which request fields a backend can honour, as frozen data: the levels and the completions table.

The machinery shared by every family; each family's tables live in its own folder (one per
endpoint: ``backends/<family>/capabilities.py``, ``backends/native/<server>_capabilities.py``).

Each field of :class:`schemas.completions.CompletionRequest` (and each nested field
named in ``schemas.completions.NESTED_FIELDS``, as ``parent.child``) has a level per
backend type: ``native`` (the upstream does it), ``translated`` (the adapter maps
it to the upstream's own form), ``emulated`` (the gateway does it), or
``unsupported`` (refused with 400 ``unsupported_parameter`` naming the field,
unless the client set it to its neutral "off" value).

Two more kinds of entry, both per backend: ``limits`` (the largest value a field may
take there, e.g. ``logprobs``: OpenAI's 5, vLLM's ``--max-logprobs``) and
:class:`Rule`s (a refusal that depends on a field's value, e.g. an empty prompt on a
server that cannot generate from no text). :meth:`Capabilities.refusal` is the one place
the refusal error is built, for the router and for every adapter's send-time check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Self

from schemas.completions import NESTED_FIELDS, NEUTRAL_VALUES, CompletionRequest
from schemas.errors import UnsupportedParameterError

__all__ = ["ALL_FIELDS", "AUDIT_USER_NOTE", "EMPTY_PROMPT", "Capabilities", "Level", "Rule", "empty_prompt"]

ALL_FIELDS: tuple[str, ...] = (*CompletionRequest.model_fields, *NESTED_FIELDS)
_NESTED_BY_PARENT: dict[str, frozenset[str]] = {
    parent: frozenset(n for n in NESTED_FIELDS if n.startswith(parent + "."))
    for parent in {n.split(".")[0] for n in NESTED_FIELDS}
}


# How ``user`` is honoured where the server has no end-user field (both endpoints' tables say it).
AUDIT_USER_NOTE = "recorded in the gateway's audit log; the server has no such field"


class Level(StrEnum):
    NATIVE = "native"
    TRANSLATED = "translated"
    EMULATED = "emulated"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True, slots=True)
class Rule:
    """A refusal that depends on a field's value: ``applies(request)`` -> refuse ``field``."""

    field: str
    why: str
    applies: Callable[[CompletionRequest], bool]


def empty_prompt(request: CompletionRequest) -> bool:
    """``""`` (or ``null``, which the schema carries as ``""``), alone or in a batch of texts; not
    next to ``prompt_embeds``, where it is left out (the embeddings are the prompt)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return not prompt and request.prompt_embeds is None
    return isinstance(prompt[0], str) and "" in prompt


EMPTY_PROMPT = 'an empty prompt ("" or null, the start of a document)'


def _value(request: CompletionRequest, field: str) -> Any:
    """A field's value, ``parent.child`` included (None when the parent is unset)."""
    if "." not in field:
        return getattr(request, field)
    parent, child = field.split(".", 1)
    holder = getattr(request, parent)
    return None if holder is None else getattr(holder, child)


@dataclass(frozen=True)
class Capabilities:
    """Levels for every request field, plus per-backend limits and value rules; build with :meth:`of`."""

    levels: Mapping[str, Level]
    unsupported: frozenset[str]
    # Why a field is unsupported, where that depends on more than the backend's type
    # (e.g. the vLLM server's version); an error naming the field can quote it.
    reasons: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    rules: tuple[Rule, ...] = ()
    # field -> the largest value this backend honours (a negative value means "all", over any limit).
    limits: Mapping[str, int] = dataclass_field(default_factory=lambda: MappingProxyType({}))
    # How the gateway honours a field, where the level alone does not say (the matrix footnotes it).
    notes: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, default: Level, **levels: Level) -> Capabilities:
        unknown = set(levels) - set(ALL_FIELDS)
        if unknown:
            raise ValueError(f"unknown request fields: {sorted(unknown)}")
        table = {name: levels.get(name, default) for name in ALL_FIELDS}
        return cls._from_table(table)

    def with_rules(self, rules: Iterable[Rule]) -> Self:
        """The same table with value rules added."""
        return replace(self, rules=(*self.rules, *rules))

    def with_limits(self, limits: Mapping[str, int]) -> Self:
        """The same table with per-field maximums (e.g. ``{"logprobs": 5}``)."""
        unknown = set(limits) - set(ALL_FIELDS)
        if unknown:
            raise ValueError(f"unknown request fields: {sorted(unknown)}")
        return replace(self, limits=MappingProxyType({**self.limits, **limits}))

    def with_notes(self, notes: Mapping[str, str]) -> Self:
        """The same table with notes on how some fields are honoured (e.g. ``user``: the audit log)."""
        unknown = set(notes) - set(self.levels)
        if unknown:
            raise ValueError(f"unknown request fields: {sorted(unknown)}")
        return replace(self, notes=MappingProxyType({**self.notes, **notes}))

    @classmethod
    def _from_table(
        cls, table: Mapping[str, Level], rules: tuple[Rule, ...] = (), limits: Mapping[str, int] | None = None
    ) -> Capabilities:
        unsupported = frozenset(name for name, level in table.items() if level is Level.UNSUPPORTED)
        return cls(MappingProxyType(dict(table)), unsupported, rules=rules, limits=MappingProxyType(dict(limits or {})))

    def with_overrides(self, overrides: Mapping[str, str]) -> Capabilities:
        """The same table with a backend entry's YAML ``capabilities`` applied.

        An operator who overrides a field takes over its value rules too (its limit stays:
        it is a fact about the server, not about the gateway).
        """
        if not overrides:
            return self
        table = dict(self.levels)
        table.update({name: Level(level) for name, level in overrides.items()})
        rules = tuple(r for r in self.rules if r.field not in overrides)
        notes = {name: note for name, note in self.notes.items() if name not in overrides}
        return self._from_table(table, rules, self.limits).with_reasons(self.reasons).with_notes(notes)

    def with_reasons(self, reasons: Mapping[str, str]) -> Self:
        """The same table with refusal reasons attached (kept only for unsupported fields)."""
        kept = {name: why for name, why in reasons.items() if name in self.unsupported}
        return replace(self, reasons=MappingProxyType(kept))

    def level(self, field: str) -> Level:
        return self.levels[field]

    def reason(self, field: str) -> str | None:
        """Why ``field`` is refused, when more can be said than "not by this backend type"."""
        whys = [rule.why for rule in self.rules if rule.field == field]
        return "; ".join(whys) if whys else self.reasons.get(field)

    def first_violation(self, request: CompletionRequest) -> str | None:
        """The first field the request sets that this backend cannot honour, if any.

        Cost: one set intersection with the fields the client set (a handful), then one
        lookup per limit and one predicate per rule (a few per table).
        """
        set_fields = request.model_fields_set
        touched = set(self.unsupported.intersection(set_fields))
        for parent, nested in _NESTED_BY_PARENT.items():
            if parent in set_fields:
                touched.update(nested.intersection(self.unsupported))
        if touched:
            for name in ALL_FIELDS:  # stable order: report fields as the schema lists them
                if name in touched and not is_neutral(name, _value(request, name)):
                    return name
        for name, limit in self.limits.items():
            if _over(getattr(request, name), limit):
                return name
        for rule in self.rules:
            if rule.applies(request):
                return rule.field
        return None

    def refusal(self, request: CompletionRequest, backend: str, kind: str) -> UnsupportedParameterError | None:
        """The 400 for the first field this backend cannot honour (None: it can serve the request).

        The one constructor of that error: the router raises it before routing, adapters
        at send time (a vLLM table may have changed with the server's version in between).
        """
        field = self.first_violation(request)
        if field is None:
            return None
        limit = self.limits.get(field)
        if limit is not None and _over(_value(request, field), limit):
            why: str | None = f"at most {limit} on this backend"
        else:
            why = self.reason(field)
        return self.refusal_error(field, backend, kind, why)

    @staticmethod
    def refusal_error(
        param: str, backend: str, kind: str, why: str | None, *, what: str | None = None
    ) -> UnsupportedParameterError:
        """The 400 ``unsupported_parameter`` naming ``param``; every endpoint's table builds it here.

        ``what`` is the thing refused when it is more than the field (a chat ``field=form``).
        """
        # Without a reason the type says it all: "... (type mock)", not "...: backend type mock does not".
        reason = f": {why}" if why else ""
        return UnsupportedParameterError(
            f"'{what or param}' is not supported by backend '{backend}' (type {kind}){reason}",
            param=param,
            backend=backend,
        )

    def strip_unsupported(self, fields: dict[str, Any]) -> None:
        """Drop from an upstream body (in place) the unsupported fields the client set to "off".

        Only neutral values can be there once the capability check has run; an upstream that
        lacks a field may refuse even its neutral value, so it is not sent at all.
        """
        for name in self.unsupported.intersection(fields):
            del fields[name]
        for parent, nested in _NESTED_BY_PARENT.items():
            holder = fields.get(parent)
            if isinstance(holder, dict):
                for name in nested.intersection(self.unsupported):
                    holder.pop(name.split(".", 1)[1], None)

    def rows(self) -> Iterable[tuple[str, Level]]:
        return ((name, self.levels[name]) for name in ALL_FIELDS)


def _over(value: Any, limit: int) -> bool:
    return isinstance(value, int) and (value > limit or value < 0 <= limit)


def is_neutral(field: str, value: Any) -> bool:
    """``None`` (null = default) or the field's documented "off" value."""
    if value is None:
        return True
    # Validation is strict, so a bool never stands for an int here and ``==`` is exact enough.
    return any(value == candidate for candidate in NEUTRAL_VALUES.get(field, ()))
