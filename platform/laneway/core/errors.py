"""The old spelling of GatewayError (status first, code as a keyword), kept only while the
Redis-backed limiters move to laneway.contracts; it builds the one GatewayError class."""

from __future__ import annotations

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError as _GatewayError


class GatewayError(_GatewayError):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(
            ErrorCode(code or "server_error"), message, param=param, retry_after=retry_after, status=status
        )


def dependency_unavailable(dependency: str, retry_after: float = 1) -> _GatewayError:
    from laneway.contracts.errors import dependency_unavailable as unavailable

    return unavailable(ErrorCode(f"{dependency.replace(' ', '_')}_unavailable"), dependency, retry_after)
