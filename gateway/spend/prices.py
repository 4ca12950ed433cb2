"""Prices as integers, and what a request's usage costs: exact, never a float.

A price of ``models[].pricing`` is a decimal with at most 6 places per million tokens, so in
millionths of the currency unit per million tokens it is an integer, and that integer is also the
price of *one* token in :data:`UNIT` (10^-12 of the currency unit). A request's cost is then
integer arithmetic: ``uncached_prompt x input + cached x cached_input + completion x output``,
summed in Python integers (no rounding, no drift however many requests) and turned into a
decimal only to be shown (:func:`money`).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from backends.base import TokenUsage
from schemas.config import PricingConfig
from schemas.config.pricing import PRICE_PLACES

__all__ = ["UNIT", "Price", "money", "money_text", "units"]

UNIT = 10**12  # units in one currency unit: a price per million tokens in millionths is per token in these


def units(amount: Decimal, places: int = PRICE_PLACES) -> int:
    """``amount`` (at most ``places`` decimal places, as the config allows) as an integer of 10^-places."""
    scaled = amount.scaleb(places)
    whole = int(scaled)
    if whole != scaled:
        raise ValueError(f"{amount} has more than {places} decimal places")
    return whole


def money(amount: int) -> Decimal:
    """``amount`` units (:data:`UNIT`) as the exact decimal of the currency unit."""
    return Decimal(amount).scaleb(-12)


def money_text(amount: int) -> str:
    """``amount`` units as a plain decimal string without exponent or trailing zeros (``0.000123``, ``12``)."""
    text = format(money(amount), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


@dataclass(frozen=True, slots=True)
class Price:
    """One route's prices, per token in :data:`UNIT` (= per million tokens in millionths)."""

    input: int
    output: int
    cached_input: int

    @classmethod
    def of(cls, config: PricingConfig) -> Price:
        cached = config.cached_input if config.cached_input is not None else config.input
        return cls(units(config.input), units(config.output), units(cached))

    def cost(self, usage: TokenUsage) -> int:
        """What ``usage`` costs, in :data:`UNIT`. Cached tokens are part of the prompt tokens
        (``usage_of`` keeps them within it) and priced at the cached rate."""
        cached = usage.cached_tokens
        return (
            (usage.prompt_tokens - cached) * self.input
            + cached * self.cached_input
            + (usage.completion_tokens * self.output)
        )
