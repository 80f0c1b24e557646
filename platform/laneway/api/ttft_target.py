"""X-Laneway-TTFT-Target-Ms (or metadata.laneway_ttft_target_ms): the tighter time to first
token a request asks for, checked at the edge. The pipeline clamps it to the tenant's grant
and the lane's bound (core/slo.py); here only its shape: a positive, finite number of
milliseconds no larger than a day. Anything else is a 400 naming where it came from."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from laneway.contracts.errors import invalid_request
from laneway.core.slo import MAX_TTFT_TARGET_MS

HEADER = "X-Laneway-TTFT-Target-Ms"
METADATA_KEY = "laneway_ttft_target_ms"
# Plain decimal notation: no sign, exponent, NaN, Infinity or digit separators ("1_000"),
# which Python's float() would take and an operator reading a log would not.
_DECIMAL = re.compile(r"\d+(\.\d+)?|\.\d+")


def ttft_target_ms(headers: Mapping[str, str], metadata: Mapping[str, str]) -> float | None:
    """The target the request asks for, in ms (the header wins over metadata); None: none. An
    empty value is none, as for X-Laneway-Priority."""
    raw, param = headers.get(HEADER.lower()), HEADER
    if not raw:
        raw, param = metadata.get(METADATA_KEY), f"metadata.{METADATA_KEY}"
    if not raw:
        return None
    text = raw.strip()
    if not _DECIMAL.fullmatch(text):
        raise invalid_request(
            f"{param} must be a positive number of milliseconds, such as 500, got '{raw[:40]}'.", param=param
        )
    value = float(text)
    if not math.isfinite(value) or value <= 0 or value > MAX_TTFT_TARGET_MS:
        raise invalid_request(
            f"{param} must be greater than 0 and at most {MAX_TTFT_TARGET_MS} ms (a day), got '{raw[:40]}'.",
            param=param,
        )
    return value
