"""The admin commands' flags read into the admin API's input fields ("none" clears a limit, a
comma list is an allow-list), and what a change did, said back in one line."""

from __future__ import annotations

import argparse
from typing import Any


def valid(raw: dict[str, Any], kind: Any, *, strict: bool = True) -> Any:
    """`raw` as the admin API's input struct (the same rules as the API and the UI); a
    refusal is a GatewayError, said in one line by with_service. strict=False: the values
    are command-line text ("500" is a number, "lots" is refused in the API's words)."""
    from laneway.admin.validation import convert

    return convert({k: v for k, v in raw.items() if v is not None}, kind, strict=strict)


# A limit's value on the command line: a number, or one of these for "no limit" (the tenant's,
# for a key); an allow-list's: names, or the word that clears it.
_UNLIMITED = ("none", "unlimited")
_EVERY_MODEL = "all"  # --models all: no allow-list (every model; a key: every model its tenant may use)
_NO_LANES = "none"


def limit_flags(args: argparse.Namespace, flags: dict[str, str]) -> dict[str, Any]:
    """The limits given on the command line, by field: "none" clears one (None), a number is
    kept as text for _valid to check. Flags left out are absent."""
    out: dict[str, Any] = {}
    for dest, field in flags.items():
        value = getattr(args, dest, None)
        if value is not None:
            out[field] = None if value.strip().lower() in _UNLIMITED else value
    return out


def list_flag(text: str, clear_word: str) -> list[str] | None:
    """A comma-separated allow-list; `clear_word` (or nothing) clears it (None)."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    return None if not items or [x.lower() for x in items] == [clear_word] else items


# Tenant flags -> TenantIn fields (tenant create and tenant set).
TENANT_LIMITS = {
    "rpm": "rpm",
    "tpm": "tpm",
    "max_concurrency": "max_concurrency",
    "weight": "weight",
    "priority_floor": "priority_floor",
    "min_ttft_target_ms": "min_ttft_target_ms",
    "daily_tokens": "tokens_per_day",
    "monthly_tokens": "tokens_per_month",
}
# Key flags -> KeyIn / KeyLimitsIn fields (key issue and key set).
KEY_LIMITS = {"rpm": "rpm", "tpm": "tpm", "max_concurrency": "max_concurrency"}
# Money budgets, given in the currency ("5.00") and sent as micro-units (core/prices.py).
MONEY = {"daily_budget": "budget_per_day", "monthly_budget": "budget_per_month"}


def money_flags(args: argparse.Namespace) -> dict[str, Any]:
    """A figure that is not an amount is kept as typed: the API's check refuses it in its words."""
    from laneway.core.prices import to_micros

    out = limit_flags(args, MONEY)
    for field, value in out.items():
        if value is not None:
            try:
                out[field] = to_micros(value)
            except ValueError:
                pass
    return out


def tenant_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = {**limit_flags(args, TENANT_LIMITS), **money_flags(args)}
    if args.models is not None:
        fields["allowed_models"] = list_flag(args.models, _EVERY_MODEL)
    if args.lanes is not None:
        fields["allowed_lanes"] = list_flag(args.lanes, _NO_LANES)
    return fields


def tenant_changes(args: argparse.Namespace) -> dict[str, Any]:
    """What `tenant set` changes: its limits, and its name and state."""
    fields = tenant_fields(args)
    if args.rename is not None:
        fields["name"] = args.rename
    if args.disabled is not None:
        fields["disabled"] = args.disabled
    return fields


def key_fields(args: argparse.Namespace) -> dict[str, Any]:
    fields = {**limit_flags(args, KEY_LIMITS), **money_flags(args)}
    if args.models is not None:
        fields["allowed_models"] = list_flag(args.models, _EVERY_MODEL)
    return fields


# What a cleared field means, said back: a tenant's, and a key's (its tenant's limits apply).
TENANT_UNSET = {"allowed_models": "all", "allowed_lanes": "none", "min_ttft_target_ms": "none"}
# Lane flags -> LaneIn fields (lane set); "none" clears a target or the cap.
LANE_SETTINGS = {
    "ttft_target_ms": "ttft_target_ms",
    "tpot_target_ms": "tpot_target_ms",
    "queue_timeout_s": "queue_timeout_s",
    "max_concurrency": "max_concurrency",
}


def lane_fields(args: argparse.Namespace) -> dict[str, Any]:
    return limit_flags(args, LANE_SETTINGS)


KEY_UNSET = "the tenant's"


def said(after: dict[str, Any], fields: list[str], unset: dict[str, str] | str) -> str:
    """`rpm 100, tokens_per_day unlimited`: what the named fields are now."""

    def word(field: str) -> str:
        value = after[field]
        if value is None:
            return unset if isinstance(unset, str) else unset.get(field, "unlimited")
        return ",".join(value) if isinstance(value, list) else str(value)

    return ", ".join(f"{f} {word(f)}" for f in fields)
