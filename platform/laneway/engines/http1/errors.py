"""What a request to the upstream can fail with."""

from __future__ import annotations


class UpstreamError(Exception):
    """The connection failed: refused, reset, closed before the answer ended, or a malformed answer."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """No connection within the connect timeout, or no byte of the answer within the read timeout."""


class ClosedBeforeAnswer(UpstreamError):
    """The connection was closed before any byte of the answer arrived (retryable once on a reused one)."""
