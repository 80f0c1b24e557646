"""GatewayError: a failure the client must hear about, with its HTTP status and OpenAI code."""

from __future__ import annotations


class GatewayError(Exception):
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
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type
        self.headers: dict[str, str] = {}
        if retry_after is not None:
            self.headers["Retry-After"] = str(max(1, int(retry_after + 0.999)))


def invalid_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def shutting_down(retry_after: float = 1) -> GatewayError:
    """This replica is draining for a shutdown: the client should retry (another replica)."""
    return GatewayError(
        503,
        "This gateway replica is shutting down; retry the request.",
        code="shutting_down",
        type="service_unavailable",
        retry_after=retry_after,
    )


def dependency_unavailable(dependency: str, retry_after: float = 1) -> GatewayError:
    """A dependency the gateway needs (Redis, the database) is down and no fallback applies."""
    return GatewayError(
        503,
        f"The gateway cannot reach its {dependency} right now; retry shortly.",
        code=f"{dependency.replace(' ', '_')}_unavailable",
        type="service_unavailable",
        retry_after=retry_after,
    )
