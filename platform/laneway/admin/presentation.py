"""How the admin UI says things: the tenant limit fields' labels, units and help, their errors
in plain words, the audit log's field-by-field changes, and times in UTC (ISO 8601, Z).

The JSON API keeps its own messages (they name the JSON field); these are for a person at a
form, next to the input they typed into.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from laneway.admin.validation import INT32_MAX
from laneway.core.dispatch import ReplicaFigures
from laneway.core.latency import LatencyReadings, curve_points
from laneway.engines.base import LoadReportingEngine
from laneway.engines.registry import LiveDeployment


@dataclass(frozen=True)
class FieldHelp:
    name: str
    label: str
    unit: str
    help: str
    rule: str  # what a valid value is, said when one is refused
    step: str = "1"
    min: str = "1"
    max: str = str(INT32_MAX)
    placeholder: str = "unlimited"
    kind: str = "number"  # number | text | select | list (one input per item) | lines | checkbox
    choices: tuple[tuple[str, str], ...] = ()  # a select's (value, words)


_WHOLE = f"a whole number from 1 to {INT32_MAX:,}"
LIMIT_FIELDS: dict[str, FieldHelp] = {
    f.name: f
    for f in (
        FieldHelp(
            "weight",
            "Weight",
            "x share",
            "Its share of a busy lane against other tenants: weight 2 gets twice the tokens of weight 1 when "
            "both are waiting. Required; 1 is the default.",
            "Weight must be a number greater than 0 and at most 100, such as 1 or 2.5.",
            step="any",
            min="0.01",
            max="100",
            placeholder="1",
        ),
        FieldHelp(
            "rpm",
            "Requests per minute",
            "requests / min",
            "Requests it may start per minute, all its keys and gateway replicas together; one over is "
            "answered 429 with Retry-After. Blank = unlimited.",
            f"Requests per minute must be {_WHOLE}, or blank for unlimited.",
        ),
        FieldHelp(
            "tpm",
            "Tokens per minute",
            "tokens / min",
            "Tokens per minute, counting each request's prompt + max_tokens when it starts; what it does not "
            "use is given back when it ends. Blank = unlimited.",
            f"Tokens per minute must be {_WHOLE}, or blank for unlimited.",
        ),
        FieldHelp(
            "max_concurrency",
            "Max concurrency",
            "requests at once",
            "Requests it may have in flight at the same time (queued or running); one more gets 429 "
            "concurrency_limit_exceeded. Blank = unlimited.",
            f"Max concurrency must be {_WHOLE}, or blank for unlimited.",
        ),
    )
}


def field_message(param: str | None, message: str) -> str:
    """The plain-words rule for a tenant limit field the gateway refused; other fields keep the
    validation layer's sentence (already plain: laneway.admin.validation.humane)."""
    found = LIMIT_FIELDS.get(param or "")
    return found.rule if found is not None else message


def typed_tenant(shown: dict[str, Any], form: dict[str, str]) -> dict[str, Any]:
    """The tenant as the rejected form had it: what was typed wins over the stored values,
    so nothing typed is lost. Comma lists become lists again (the template joins them)."""
    out = dict(shown)
    for name, value in form.items():
        if name == "csrf_token":
            continue
        out[name] = [x.strip() for x in value.split(",") if x.strip()] if name.startswith("allowed_") else value
    if "name" not in form:  # the edit form: an unticked box is absent
        out["disabled"] = form.get("disabled") == "true"
    return out


def iso_utc(value: datetime | None) -> str:
    """ISO 8601 in UTC with a Z, to the second; SQLite hands back naive times written in UTC."""
    if value is None:
        return ""
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%SZ")


def _shown(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "(empty)"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return iso_utc(datetime.fromisoformat(value))
        except ValueError:
            return value
    return str(value)


def audit_changes(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(field, before, after) for each field that differs, in the entity's field order; a
    created entity lists every field it was created with, a deleted one every field it had."""
    old, new = before or {}, after or {}
    fields = list(dict.fromkeys([*old, *new]))
    return [
        (f, _shown(old.get(f)) if before is not None else "", _shown(new.get(f)) if after is not None else "")
        for f in fields
        if f != "id" and (before is None or after is None or old.get(f) != new.get(f))
    ]


def replica_state(live: LiveDeployment | None, figures: ReplicaFigures | None) -> dict[str, str]:
    """One replica's live state for the models page: health, requests in flight against its
    slots, the load its engine reports, and dispatch's estimated prefix hit rate."""
    if live is None:
        return {"health": "-", "in_flight": "-", "engine_load": "-", "hit_rate": "-"}
    health = "healthy" if live.healthy and not live.probing else "probing" if live.healthy else "ejected"
    engine = live.engine
    reported = engine.reported_load() if isinstance(engine, LoadReportingEngine) else None
    load = (
        "-"
        if reported is None
        else (f"{reported.running:g} running, {reported.waiting:g} waiting, KV {reported.kv_usage:.0%}")
    )
    rate = figures.hit_rate if figures is not None else None
    hit = "-" if rate is None or figures is None else f"{rate:.0%} of {figures.placed} requests"
    return {
        "health": health,
        "in_flight": f"{live.outstanding} / {engine.info.max_concurrency}",
        "engine_load": load,
        "hit_rate": hit,
    }


def latency_shown(learned: LatencyReadings | None, slots: int) -> dict[str, str]:
    """One replica's learned latency for the models page (core/latency/): its prefill rate, its
    decode step time at a few batch sizes, how far off its TTFT predictions have been, and its
    learned running limit (of its engine's slots)."""
    if learned is None:
        return {"prefill_rate": "-", "step_curve": "-", "ttft_error": "-", "concurrency_limit": "-"}
    rate = learned.prefill_s_per_token
    steps = [(n, learned.step_at(n)) for n in curve_points(slots)]
    curve = ", ".join(f"{n}: {s * 1000:.1f} ms" for n, s in steps if s is not None)
    error = learned.ttft_error
    return {
        "prefill_rate": "-" if rate is None else f"{rate * 1e6:.1f} ms per 1k tokens",
        "step_curve": curve or "-",
        "ttft_error": "-" if error is None else f"{error:.0%} (of {learned.ttft_weight:.0f} recent)",
        "concurrency_limit": "-" if learned.concurrency_limit is None else f"{learned.concurrency_limit} / {slots}",
    }
