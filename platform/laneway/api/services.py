"""What the /v1 handlers need from the runtime, as ONE dependency (`api`).

Each dependency a handler declares is resolved per request (several at one level run in a
task group), so the hot path takes one pre-built object. SkipValidation: it is the
runtime's own object, not client input; checking it would cost every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from litestar.di import NamedDependency
from litestar.params import SkipValidation

from laneway.core.auth import KeyAuthenticator
from laneway.core.pipeline import Gateway


@dataclass(frozen=True, slots=True)
class ApiServices:
    gateway: Gateway
    authenticator: KeyAuthenticator
    stream_send_timeout_s: float
    started_at: float  # the models' `created`


Api: TypeAlias = SkipValidation[NamedDependency[ApiServices]]
