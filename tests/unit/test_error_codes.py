"""Each error code carries what follows from it, and docs/architecture.md's table says the same."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from laneway.contracts.codes import ErrorCode, reason_of
from laneway.contracts.errors import GatewayError, error_type

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
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
    assert error.type == error_type(error.status) or code.status == 499


def test_a_status_override_keeps_the_code_and_follows_the_status_for_its_type() -> None:
    error = GatewayError(ErrorCode.NOT_FOUND, "no such route", status=405)
    assert (error.status, error.type, error.code) == (405, "invalid_request_error", "not_found")


def test_retry_after_rounds_up_to_whole_seconds() -> None:
    assert GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after=0.2).headers == {"Retry-After": "1"}
    assert GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after=2.5).headers == {"Retry-After": "3"}


def test_metric_reasons_come_from_the_code_and_unknown_codes_have_none() -> None:
    assert reason_of("queue_full") == "queue_full"
    assert reason_of("rate_limiter_unavailable") == reason_of("database_unavailable") == "dependency"
    assert reason_of("invalid_request") is None and reason_of("no_such_code") is None and reason_of(None) is None
