"""A batch's input file, checked when the batch is created, so a bad file fails at once and
clearly (400 in OpenAI's shape, naming the line) instead of hours later: JSONL, each line's
`url` the batch's endpoint, `custom_id`s unique, models the tenant may use, within the size
limits. What only the engine can judge (a context overflow, a parameter its model lacks)
fails that line at run time, into the error file."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from laneway.api.registry import batch_paths
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError, invalid_request
from laneway.types import TenantSnapshot

WINDOWS = {"24h": 24 * 3600}
MAX_CUSTOM_ID = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a custom_id is stored as text: PostgreSQL holds no NUL


class _Line(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    custom_id: str
    method: str
    url: str
    body: dict[str, object]


@dataclass(frozen=True, slots=True)
class Limits:
    max_lines: int
    max_bytes: int


def _bad(line: int | None, message: str, param: str = "input_file_id") -> GatewayError:
    where = f"Line {line} of the input file: " if line is not None else ""
    return invalid_request(where + message, param=param)


def check_request(endpoint: str, completion_window: str) -> None:
    paths = batch_paths()  # the endpoints marked `batch` (api/registry.py)
    if endpoint not in paths:
        raise invalid_request(f"`endpoint` must be one of {', '.join(paths)}; got '{endpoint[:80]}'.", param="endpoint")
    if completion_window not in WINDOWS:
        raise invalid_request(
            f"`completion_window` must be '24h'; got '{completion_window[:20]}'.", param="completion_window"
        )


def parse_lines(
    content: bytes,
    endpoint: str,
    tenant: TenantSnapshot,
    known_model: Callable[[str], bool],
    limits: Limits,
) -> tuple[str, list[tuple[str, str]]]:
    """The one model the lines name, and (custom_id, body as JSON text) per line, in file
    order; or a 400 for the first problem. CPU-bound on a big file: the caller runs it in a
    thread."""
    if len(content) > limits.max_bytes:
        raise _bad(None, f"the file has {len(content)} bytes; a batch's input may have at most {limits.max_bytes}.")
    if b"\x00" in content:
        raise _bad(None, "the file holds a NUL byte; it must be JSONL text (UTF-8).")
    items: list[tuple[str, str]] = []
    seen: set[str] = set()
    models: list[str] = []
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(items) == limits.max_lines:
            raise _bad(
                None,
                f"the file has more than {limits.max_lines} requests; a batch may have at most {limits.max_lines}.",
            )
        items.append(_checked(number, raw, endpoint, tenant, known_model, seen, models))
    if not items:
        raise _bad(None, "the file has no requests; give one JSON object per line.")
    return models[0], items


def _checked(
    number: int,
    raw: bytes,
    endpoint: str,
    tenant: TenantSnapshot,
    known_model: Callable[[str], bool],
    seen: set[str],
    models: list[str],
) -> tuple[str, str]:
    try:
        line = msgspec.json.decode(raw, type=_Line)
    except msgspec.ValidationError as exc:
        raise _bad(number, f'{exc}. Each line is {{"custom_id", "method", "url", "body"}}.') from None
    except msgspec.DecodeError:
        raise _bad(number, "not valid JSON; the file must be JSONL (one JSON object per line).") from None
    if not line.custom_id or len(line.custom_id) > MAX_CUSTOM_ID or _CONTROL.search(line.custom_id):
        raise _bad(
            number, f"`custom_id` must have 1 to {MAX_CUSTOM_ID} characters, without NUL or other control characters."
        )
    if line.custom_id in seen:
        raise _bad(number, f"the custom_id '{line.custom_id[:80]}' appears twice; each request needs its own.")
    seen.add(line.custom_id)
    if line.method != "POST":
        raise _bad(number, f"`method` must be POST; got '{line.method[:20]}'.")
    if line.url != endpoint:
        raise _bad(
            number,
            f"`url` is '{line.url[:80]}' but the batch's endpoint is '{endpoint}'; every line "
            "must call the batch's endpoint.",
        )
    model = line.body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad(number, "`body.model` must name a model.")
    if not known_model(model):
        raise GatewayError(
            ErrorCode.MODEL_NOT_FOUND,
            f"Line {number} of the input file: the model '{model[:80]}' "
            "does not exist or you do not have access to it.",
            param="input_file_id",
        )
    if not tenant.may_use(model):
        raise GatewayError(
            ErrorCode.MODEL_NOT_ALLOWED,
            f"Line {number} of the input file: your key is not allowed to use the model '{model[:80]}'.",
            param="input_file_id",
        )
    if models and model != models[0]:
        raise _bad(
            number,
            f"the model is '{model[:80]}' but line 1 names '{models[0][:80]}'; a batch's requests "
            "all use one model, as OpenAI's do.",
        )
    models[:1] = [model]
    if line.body.get("stream"):
        raise _bad(number, "`body.stream` is true; a batch's requests are answered whole, not streamed.")
    return line.custom_id, msgspec.json.encode(line.body).decode()
