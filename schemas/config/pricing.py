"""What tokens cost (``models[].pricing``, ``models[].routes[].pricing``) and what a key may spend
(``auth.keys[].budget``): exact decimals, in whatever currency the prices are written in."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field

from schemas.config.common import _Strict

__all__ = ["PRICE_PLACES", "BudgetConfig", "Money", "PricingConfig"]

PRICE_PLACES = 6  # decimal places of a price or budget: a millionth of the currency unit
_MAX = 1_000_000  # per million tokens, or per budget: keeps every total far inside 64-bit counters

# A price or an amount: a number or a string (``0.15``, ``"0.0375"``), read as the decimal it
# spells (never through a binary float), at most 6 decimal places.
Money = Annotated[Decimal, Field(ge=0, le=_MAX, decimal_places=PRICE_PLACES, allow_inf_nan=False)]


class PricingConfig(_Strict):
    """Prices per million tokens. ``cached_input`` prices the prompt tokens the upstream read from its
    prompt cache (``prompt_tokens_details.cached_tokens``); unset, they cost ``input``."""

    input: Money
    output: Money
    cached_input: Money | None = None


class BudgetConfig(_Strict):
    """The most a key may spend per ``period``: ``day`` and ``month`` restart at 00:00 UTC (the
    month's first day), ``total`` never. A key that has spent it gets 429 until the period restarts."""

    amount: Annotated[Money, Field(gt=0)]
    period: Literal["day", "month", "total"]
