"""The rate limiter's refusals (429), each saying which limit and when to retry, and the check
that refuses a request no wait would let through."""

from __future__ import annotations

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.quota import PERIOD_KINDS, quota_limit, quota_too_small
from laneway.types import TenantSnapshot


def too_large(tenant: TenantSnapshot, tokens: int) -> GatewayError:
    return GatewayError(
        ErrorCode.REQUEST_TOO_LARGE,
        f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and tenant '{tenant.name}' "
        f"may use {tenant.tpm} tokens per minute. Lower max_tokens or shorten the prompt.",
    )


def rate_limited(tenant: TenantSnapshot, wait_s: float) -> GatewayError:
    return GatewayError(
        ErrorCode.RATE_LIMIT_EXCEEDED,
        f"Rate limit reached for tenant '{tenant.name}' (RPM {tenant.rpm or 'unlimited'}, "
        f"TPM {tenant.tpm or 'unlimited'}). Retry in {wait_s:.1f} s.",
        retry_after=wait_s,
    )


def too_many_concurrent(tenant: TenantSnapshot) -> GatewayError:
    return GatewayError(
        ErrorCode.CONCURRENCY_LIMIT_EXCEEDED,
        f"Tenant '{tenant.name}' already has {tenant.max_concurrency} requests in flight.",
        retry_after=1,
    )


def key_rate_limited(tenant: TenantSnapshot, wait_s: float) -> GatewayError:
    return GatewayError(
        ErrorCode.RATE_LIMIT_EXCEEDED,
        f"Rate limit reached for this API key of tenant '{tenant.name}' (key RPM {tenant.key_rpm or 'unlimited'}, "
        f"key TPM {tenant.key_tpm or 'unlimited'}). Retry in {wait_s:.1f} s.",
        retry_after=wait_s,
    )


def key_too_many_concurrent(tenant: TenantSnapshot) -> GatewayError:
    return GatewayError(
        ErrorCode.CONCURRENCY_LIMIT_EXCEEDED,
        f"This API key of tenant '{tenant.name}' already has {tenant.key_max_concurrency} requests in flight.",
        retry_after=1,
    )


def check_size(tenant: TenantSnapshot, tokens: int) -> None:
    """Refuse a request no wait would let through: larger than a TPM bucket or a whole quota."""
    if tenant.tpm and tokens > tenant.tpm:
        raise too_large(tenant, tokens)
    if tenant.key_tpm and tokens > tenant.key_tpm:
        raise GatewayError(
            ErrorCode.REQUEST_TOO_LARGE,
            f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and this API key may use "
            f"{tenant.key_tpm} tokens per minute. Lower max_tokens or shorten the prompt.",
        )
    for kind in PERIOD_KINDS:
        limit = quota_limit(tenant, kind)
        if limit and tokens > limit:
            raise quota_too_small(tenant, kind, limit, tokens)
