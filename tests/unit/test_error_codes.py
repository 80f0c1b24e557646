"""Each error code carries what follows from it, and docs/architecture.md's table says the same."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
from laneway.api.batches.finalize import _files
from laneway.contracts.codes import ErrorCode, reason_of
from laneway.contracts.errors import GatewayError, error_type
from laneway.core.pipeline import Call
from laneway.types import TenantSnapshot

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "laneway"
# Strings that spell a code's value but are not one: OpenAI's error *type* "server_error",
# failover's reason label "engine_error", a deployment's `overloaded` attribute.
NOT_CODES = {
    ("api/messages/errors.py", "request_too_large"),  # Anthropic's error type for a 413
    ("api/sse.py", "server_error"),
    ("contracts/errors.py", "server_error"),
    ("core/pipeline/failover.py", "engine_error"),
    ("engines/registry.py", "overloaded"),
}
ROW = re.compile(r"^\| `([a-z_]+)` \| (\d{3}) \| `([a-z_]+)` \| (?:`([a-z_]+)`|-) \| (yes|no) \|$", re.M)


def test_the_documented_table_is_the_enum() -> None:
    documented = {m[1]: (int(m[2]), m[3], m[4] or None, m[5] == "yes") for m in ROW.finditer(DOC.read_text())}
    actual = {c.value: (c.status, c.info.type, c.info.reason, c.retryable) for c in ErrorCode}
    assert documented == actual


@pytest.mark.parametrize("code", list(ErrorCode))
def test_an_error_takes_its_status_type_and_retryability_from_its_code(code: ErrorCode) -> None:
    error = GatewayError(code, "why")
    assert (error.status, error.type, error.retryable, error.code) == (
        code.status,
        code.info.type,
        code.retryable,
        code,
    )
    assert error.type == error_type(error.status)


def test_what_the_client_did_is_499_and_what_laneway_or_a_dependency_did_is_5xx() -> None:
    """DESIGN's one classification: a client that went away, or read so slowly that laneway cut
    it, is 499 in the usage row; laneway's or a dependency's fault is 500/503."""
    client_side = {ErrorCode.CLIENT_DISCONNECTED, ErrorCode.SLOW_CLIENT, ErrorCode.BACKPRESSURE}
    assert {c for c in client_side if c.status == 499} == client_side
    for code in (ErrorCode.ENGINE_ERROR, ErrorCode.SHUTTING_DOWN, ErrorCode.DATABASE_UNAVAILABLE):
        assert code.status == 503
    assert ErrorCode.INTERNAL_ERROR.status == 500


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after=0.2).headers == {"Retry-After": "1"}
    assert GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after=2.5).headers == {"Retry-After": "3"}


def test_metric_reasons_come_from_the_code_and_unknown_codes_have_none() -> None:
    assert reason_of("queue_full") == "queue_full"
    assert reason_of("rate_limiter_unavailable") == reason_of("database_unavailable") == "dependency"
    assert reason_of("invalid_request") is None and reason_of("no_such_code") is None and reason_of(None) is None


def _call() -> Call:
    """A Call with only what fail() and status read (the rest is not looked at here)."""
    none: Any = None
    return Call("r1", TenantSnapshot(id=1, name="acme", api_key_id=1), "m", "chat", False, none, none, none)


def test_a_calls_status_is_its_codes_and_the_first_cause_stands() -> None:
    call = _call()
    assert (call.status, call.error_code) == (200, None)
    call.fail(ErrorCode.BACKPRESSURE)
    call.fail(ErrorCode.CLIENT_DISCONNECTED)  # the cancellation the cut caused: not relabelled
    assert (call.status, call.error_code) == (499, ErrorCode.BACKPRESSURE)
    for code in ErrorCode:
        other = _call()
        other.fail(code)
        assert (other.status, other.error_code) == (code.status, code)


def test_no_code_is_spelled_outside_the_enum() -> None:
    """Every code reaches a call, a response, a row or a line as an ErrorCode member: a string
    that spells one (a call.fail("slow_client"), a status picked beside it) is a second source
    of truth, and mypy cannot see a literal that happens to be a str."""
    values = {c.value for c in ErrorCode}
    spelled = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "contracts/codes.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in values and (where, node.value) not in NOT_CODES:
                spelled.append(f"{where}:{node.lineno} {node.value!r}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "fail"
                and ast.unparse(node.func.value).endswith("call")  # a Call's, not an HTTP response's
                and (len(node.args) != 1 or node.keywords)
            ):
                spelled.append(f"{where}:{node.lineno} Call.fail takes one ErrorCode, no status")
    assert spelled == []


def test_a_batch_line_that_never_ran_names_its_code() -> None:
    _, errors = _files([("a", "expired", None), ("b", "cancelled", None), ("c", "succeeded", '{"ok": 1}')])
    assert errors is not None
    codes = [json.loads(line)["error"]["code"] for line in errors.decode().splitlines()]
    assert codes == [ErrorCode.BATCH_EXPIRED, ErrorCode.BATCH_CANCELLED]
    assert ErrorCode.BATCH_EXPIRED.retryable and not ErrorCode.BATCH_CANCELLED.retryable
