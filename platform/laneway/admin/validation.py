"""Admin input at the edge: string types that PostgreSQL can store, bounded numbers, JSON
bodies that must be objects, query and path values checked by hand, and msgspec's errors
turned into plain sentences that name the field (400 in OpenAI's shape, param = the field).

PostgreSQL's text cannot hold NUL and an INTEGER column overflows past 2**31-1: both were
500s before they were refused here."""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

import msgspec
from msgspec import Meta

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, validation_error
from laneway.core.slo import MAX_TPOT_TARGET_MS, MAX_TTFT_TARGET_MS

# \Z, not $: "$" also matches before a final line break, which would let "name\n" through.
NO_CONTROL_CHARS = r"^[^\x00-\x1f\x7f]*\Z"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
INT32_MAX = 2_147_483_647  # an INTEGER column (PostgreSQL) holds no more


TenantName = Annotated[str, Meta(min_length=1, max_length=120, pattern=NO_CONTROL_CHARS)]
KeyName = Annotated[str, Meta(min_length=1, max_length=120, pattern=NO_CONTROL_CHARS)]
Username = Annotated[str, Meta(min_length=1, max_length=120, pattern=NO_CONTROL_CHARS)]
LaneName = Annotated[str, Meta(min_length=1, max_length=60, pattern=NO_CONTROL_CHARS)]
ModelAlias = Annotated[str, Meta(min_length=1, max_length=200, pattern=NO_CONTROL_CHARS)]
DeploymentName = Annotated[str, Meta(min_length=1, max_length=200, pattern=NO_CONTROL_CHARS)]
EngineKind = Annotated[str, Meta(min_length=1, max_length=40, pattern=NO_CONTROL_CHARS)]
Quantization = Annotated[str, Meta(min_length=1, max_length=40, pattern=NO_CONTROL_CHARS)]
GpuType = Annotated[str, Meta(min_length=1, max_length=60, pattern=NO_CONTROL_CHARS)]
Description = Annotated[str, Meta(max_length=500, pattern=NO_CONTROL_CHARS)]
Positive = Annotated[int, Meta(ge=1, le=INT32_MAX)]
Int32 = Annotated[int, Meta(ge=-INT32_MAX, le=INT32_MAX)]
# Quotas are BIGINT columns, and Redis's Lua counts in doubles: exact well past this.
MAX_TOKEN_QUOTA = 10**15
TokenQuota = Annotated[int, Meta(ge=1, le=MAX_TOKEN_QUOTA)]
# A money budget in micro-units of the currency (core/budgets.py): up to 10**15 micro-units
# (a billion), within what Redis's Lua numbers hold exactly.
MAX_BUDGET_MICROS = 10**15
MoneyBudget = Annotated[int, Meta(ge=1, le=MAX_BUDGET_MICROS)]
MAX_EXPIRES_DAYS = 36_500  # 100 years; beyond, the expiry date overflows
ExpiresDays = Annotated[float, Meta(gt=0, le=MAX_EXPIRES_DAYS)]

# The repetition rule keeps its last n-gram as a tuple per unit (core/early_stops.py).
MAX_REPETITION_NGRAM = 64

# Fields whose rule is easier said once than derived from msgspec's text.
FIELD_RULES = {
    "expires_days": f"expires_days must be a number of days greater than 0 (at most {MAX_EXPIRES_DAYS}).",
    "priority_floor": "priority_floor must be a whole number from -1000 to 1000 (lower numbers run first).",
    "weight": "weight must be a number greater than 0 and at most 100.",
    "tokens_per_day": f"tokens_per_day must be a whole number of tokens from 1 to {MAX_TOKEN_QUOTA:,} per UTC day "
    "(empty or null: no daily quota).",
    "tokens_per_month": f"tokens_per_month must be a whole number of tokens from 1 to {MAX_TOKEN_QUOTA:,} per "
    "calendar month in UTC (empty or null: no monthly quota).",
    "repetition_ngram": f"repetition_ngram must be a whole number of words (a punctuation mark counts as one) from "
    f"1 to {MAX_REPETITION_NGRAM} (empty or null: no repetition stop).",
    "repetition_count": "repetition_count must be a whole number from 2 to 1000: how many times the n-gram must "
    "appear.",
    "ttft_target_ms": f"ttft_target_ms must be a whole number of milliseconds from 1 to {MAX_TTFT_TARGET_MS:,} "
    "(a day), within the lane's queue timeout (empty or null: no target).",
    "tpot_target_ms": f"tpot_target_ms must be a whole number of milliseconds per token from 1 to "
    f"{MAX_TPOT_TARGET_MS:,} (empty or null: no target).",
    "min_ttft_target_ms": f"min_ttft_target_ms must be a whole number of milliseconds from 1 to "
    f"{MAX_TTFT_TARGET_MS:,} (empty or null: the tenant may not ask for tighter TTFT targets than its lanes').",
}


def check_text(param: str, value: str, *, max_length: int, allow_empty: bool = False) -> str:
    """A path or query value under the same rules as the string types above."""
    if not value and not allow_empty:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"{param} must not be empty.", param=param)
    if len(value) > max_length:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST, f"{param} must be at most {max_length} characters long.", param=param
        )
    if _CONTROL.search(value):
        raise GatewayError(ErrorCode.INVALID_REQUEST, _no_control(param), param=param)
    return value


def int_query(param: str, raw: str | None, *, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within lo..hi; anything else is a 400 naming it."""
    if raw is None or raw == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or not lo <= value <= hi:
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"{param} must be a whole number from {lo} to {hi}.", param=param)
    return value


def decode_object(body: bytes) -> dict[str, Any]:
    """A JSON body that must be an object (an empty body is {}); 400 invalid_json otherwise."""
    try:
        decoded = msgspec.json.decode(body or b"{}")
    except msgspec.DecodeError:
        raise _not_json(body) from None
    if not isinstance(decoded, dict):
        raise GatewayError(ErrorCode.INVALID_JSON, "The request body must be a JSON object ({...}).")
    return decoded


def decode(body: bytes, kind: type[Any]) -> Any:
    """The body as `kind` (a Struct), with plain-words errors naming the field."""
    try:
        return msgspec.json.decode(body or b"{}", type=kind)
    except msgspec.ValidationError as exc:
        raise humane(exc) from None
    except msgspec.DecodeError:
        raise _not_json(body) from None


def convert(raw: dict[str, Any], kind: type[Any], *, strict: bool = True) -> Any:
    """`raw` (e.g. from a form) as `kind`, with the same errors as decode()."""
    try:
        return msgspec.convert(raw, kind, strict=strict)
    except msgspec.ValidationError as exc:
        raise humane(exc) from None


def humane(exc: msgspec.ValidationError) -> GatewayError:
    """msgspec's "Expected `int` >= 1 - at `$.rpm`" as "rpm must be at least 1.", param rpm."""
    text_ = str(exc)
    param = validation_error(exc).param or ""
    unknown = re.search(r"unknown field `([^`]+)`", text_)
    if unknown:
        name = f"{param}.{unknown.group(1)}" if param else unknown.group(1)
        return GatewayError(ErrorCode.INVALID_REQUEST, f"{name} is not a field this accepts.", param=name)
    if not param and "Expected `object`" in text_:
        return GatewayError(ErrorCode.INVALID_JSON, "The request body must be a JSON object ({...}).")
    field = re.sub(r"\[\d+\]$", "", param).rsplit(".", 1)[-1]
    message = FIELD_RULES.get(field) or _sentence(param or "The request body", text_)
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param or None)


_KIND_WORDS = {
    "int": "a whole number",
    "float": "a number",
    "str": "text",
    "bool": "true or false",
    "array": "a list",
    "object": "an object",
}
_COMPARE_WORDS = {">=": "at least", ">": "greater than", "<=": "at most", "<": "less than"}


def _sentence(param: str, text_: str) -> str:
    if "missing required field" in text_:
        return f"{param} is required."
    if "matching regex" in text_:
        return _no_control(param)
    if "Number out of range" in text_:
        return f"{param} is out of range."
    length = re.search(r"Expected `(\w+)` of length (>=|<=) (\d+)", text_)
    if length:
        kind, op, n = length.groups()
        if op == ">=" and n == "1":
            return f"{param} must not be empty."
        if kind == "str":
            return f"{param} must be {_COMPARE_WORDS[op]} {n} characters long."
        return f"{param} must have {_COMPARE_WORDS[op]} {n} items."
    bound = re.search(r"Expected `(\w+)` (>=|>|<=|<) ([-\d.e+]+)", text_)
    if bound:
        kind, op, n = bound.groups()
        number = n[:-2] if n.endswith(".0") else n
        return f"{param} must be {_KIND_WORDS.get(kind, kind)}, {_COMPARE_WORDS[op]} {number}."
    kinds = re.search(r"Expected `([^`]+)`, got `([^`]+)`", text_)
    if kinds:
        wanted = [k.strip() for k in kinds.group(1).split("|") if k.strip() != "null"]
        words = " or ".join(_KIND_WORDS.get(re.sub(r"\[.*", "", k), k) for k in wanted)
        got = _KIND_WORDS.get(kinds.group(2), kinds.group(2))
        return f"{param} must be {words} (got {got})."
    return f"{param} is not valid: {text_}"


def _no_control(param: str) -> str:
    return f"{param} must not contain control characters (such as NUL or line breaks)."


class _NonFinite:
    pass


def _not_json(body: bytes) -> GatewayError:
    """Invalid JSON; a NaN or Infinity (which JSON lacks) is named by its field."""
    marker = _NonFinite()
    try:
        parsed = json.loads(body, parse_constant=lambda _: marker)
    except (ValueError, RecursionError):
        parsed = None
    path = _find(parsed, marker, "")
    if path is not None:
        field = re.sub(r"\[\d+\]$", "", path).rsplit(".", 1)[-1]
        message = FIELD_RULES.get(field) or f"{path} must be a finite number (JSON has no NaN or Infinity)."
        return GatewayError(ErrorCode.INVALID_REQUEST, message, param=path)
    return GatewayError(ErrorCode.INVALID_JSON, "The request body is not valid JSON.")


def _find(value: Any, marker: object, path: str) -> str | None:
    if value is marker:
        return path
    if isinstance(value, float) and not math.isfinite(value):
        return path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _find(item, marker, f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}".lstrip("."))
        if found is not None:
            return found
    return None
