"""A model alias's price and the cost of a request at it, in exact integer arithmetic.

Prices are integers in micro-units of the currency (LANEWAY_CURRENCY) per 1M tokens: $2.50
per 1M tokens is 2_500_000. A cost is an integer in micro-units of the currency, rounded
half up once per request from the exact product (tokens x price / 1M). Integers because they
are exact and the same on SQLite, PostgreSQL and in Redis (whose counters are int64 and
whose Lua numbers are doubles, exact to 2**53 micro-units: 9e9 of the currency); a request's
rounding is at most half a micro-unit, below any bill's granularity.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

MICROS = 1_000_000  # micro-units in one unit of the currency
PER_TOKENS = 1_000_000  # prices are per this many tokens


@dataclass(frozen=True, slots=True)
class Price:
    """Micro-units of the currency per 1M tokens: prompt tokens, completion tokens, and the
    prompt tokens an engine served from its prefix cache (the input price when None)."""

    input: int
    output: int
    cached_input: int | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        """Micro-units of the currency, rounded half up from the exact figure."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        exact = (prompt_tokens - cached) * self.input + cached * cached_price + completion_tokens * self.output
        return (exact + PER_TOKENS // 2) // PER_TOKENS

    def most(self, prompt_tokens: int, max_tokens: int) -> int:
        """The most a request can cost (every prompt token at the input price, max_tokens of
        completion), rounded up: what a money budget reserves."""
        exact = prompt_tokens * max(self.input, self.cached_input or 0) + max_tokens * self.output
        return -(-exact // PER_TOKENS)


def to_micros(amount: str | float | int) -> int:
    """'2.50' (the currency per 1M tokens) -> 2500000; at most 6 decimals, never negative."""
    try:
        value = Decimal(str(amount))
    except InvalidOperation:
        raise ValueError(f"{amount!r} is not a number") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"{amount!r} is not a price (a number, 0 or more)")
    micros = value * MICROS
    if micros != micros.to_integral_value():
        raise ValueError(f"{amount!r} has more than 6 decimals")
    return int(micros)


def from_micros(micros: int | None) -> str | None:
    """2500000 -> '2.5': the figure as written, exact (a string, never a float)."""
    if micros is None:
        return None
    text = str((Decimal(micros) / MICROS).quantize(Decimal("0.000001"), rounding=ROUND_HALF_UP).normalize())
    return text if "E" not in text else str(int(Decimal(text)))
