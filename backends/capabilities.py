"""Which request fields a backend can honour, as frozen data.

Each field of :class:`schemas.completions.CompletionRequest` has a level per
backend type: ``native`` (the upstream does it), ``translated`` (the adapter maps
it to the upstream's own form), ``emulated`` (the gateway does it), or
``unsupported`` (refused with 400 ``unsupported_parameter`` naming the field,
unless the client set it to its neutral "off" value).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from dataclasses import field as dataclass_field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

from schemas.completions import NEUTRAL_VALUES, CompletionRequest

__all__ = ["ALL_FIELDS", "Capabilities", "Level"]

ALL_FIELDS: tuple[str, ...] = tuple(CompletionRequest.model_fields)


class Level(StrEnum):
    NATIVE = "native"
    TRANSLATED = "translated"
    EMULATED = "emulated"
    UNSUPPORTED = "unsupported"


@dataclass(frozen=True)
class Capabilities:
    """Levels for every request field; build with :meth:`of`."""

    levels: Mapping[str, Level]
    unsupported: frozenset[str]
    # Why a field is unsupported, where that depends on more than the backend's type
    # (e.g. the vLLM server's version); an error naming the field can quote it.
    reasons: Mapping[str, str] = dataclass_field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(cls, default: Level, **levels: Level) -> Capabilities:
        unknown = set(levels) - set(ALL_FIELDS)
        if unknown:
            raise ValueError(f"unknown request fields: {sorted(unknown)}")
        table = {name: levels.get(name, default) for name in ALL_FIELDS}
        return cls._from_table(table)

    @classmethod
    def _from_table(cls, table: Mapping[str, Level]) -> Capabilities:
        unsupported = frozenset(name for name, level in table.items() if level is Level.UNSUPPORTED)
        return cls(MappingProxyType(dict(table)), unsupported)

    def with_overrides(self, overrides: Mapping[str, str]) -> Capabilities:
        """The same table with a backend entry's YAML ``capabilities`` applied."""
        if not overrides:
            return self
        table = dict(self.levels)
        table.update({name: Level(level) for name, level in overrides.items()})
        return self._from_table(table).with_reasons(self.reasons)

    def with_reasons(self, reasons: Mapping[str, str]) -> Capabilities:
        """The same table with refusal reasons attached (kept only for unsupported fields)."""
        kept = {name: why for name, why in reasons.items() if name in self.unsupported}
        return replace(self, reasons=MappingProxyType(kept))

    def level(self, field: str) -> Level:
        return self.levels[field]

    def reason(self, field: str) -> str | None:
        """Why ``field`` is unsupported, when more can be said than "not by this backend type"."""
        return self.reasons.get(field)

    def first_violation(self, request: CompletionRequest) -> str | None:
        """The first field the request sets that this backend cannot honour, if any.

        Cost: one set intersection with the fields the client set (a handful).
        """
        touched = self.unsupported.intersection(request.model_fields_set)
        if not touched:
            return None
        for name in ALL_FIELDS:  # stable order: report fields as the schema lists them
            if name in touched and not is_neutral(name, getattr(request, name)):
                return name
        return None

    def rows(self) -> Iterable[tuple[str, Level]]:
        return ((name, self.levels[name]) for name in ALL_FIELDS)


def is_neutral(field: str, value: Any) -> bool:
    """``None`` (null = default) or the field's documented "off" value."""
    if value is None:
        return True
    # Validation is strict, so a bool never stands for an int here and ``==`` is exact enough.
    return any(value == candidate for candidate in NEUTRAL_VALUES.get(field, ()))
