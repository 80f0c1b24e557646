"""Why a request was refused, in words a customer can act on: one sentence per 429 and 503 code."""

from __future__ import annotations

from laneway.contracts.codes import ErrorCode

_WORDS: dict[ErrorCode, str] = {
    ErrorCode.RATE_LIMIT_EXCEEDED: "Too many requests or tokens per minute for your tenant or key (RPM/TPM).",
    ErrorCode.REQUEST_TOO_LARGE: "One request asked for more tokens than your per-minute token limit holds.",
    ErrorCode.CONCURRENCY_LIMIT_EXCEEDED: "Too many requests at once for your tenant or key.",
    ErrorCode.QUOTA_EXCEEDED: "Your daily or monthly token quota was used up; it resets at the period's end.",
    ErrorCode.BUDGET_EXCEEDED: "Your daily or monthly spending budget was used up; it resets at the period's end.",
    ErrorCode.QUEUE_FULL: "The model's queue was full; retry after the Retry-After it sent.",
    ErrorCode.TENANT_QUEUE_SHARE: "You already had your fair share of the model's queue waiting.",
    ErrorCode.PREDICTED_WAIT_EXCEEDED: "The wait for the model was predicted to exceed the lane's limit.",
    ErrorCode.QUEUE_TIMEOUT: "The request waited for the model longer than its lane allows.",
    ErrorCode.ENGINE_ERROR: "The model's engine failed; retrying is safe.",
    ErrorCode.SHUTTING_DOWN: "The gateway replica was restarting; retrying is safe.",
    ErrorCode.PREEMPTED: "Background work made way for interactive requests.",
    ErrorCode.RATE_LIMITER_UNAVAILABLE: "The service that counts limits was briefly unreachable.",
    ErrorCode.DATABASE_UNAVAILABLE: "The gateway's database was briefly unreachable.",
    ErrorCode.OVERLOADED: "The gateway was overloaded and shed load.",
}


def in_words(code: str) -> str:
    try:
        return _WORDS.get(ErrorCode(code), f"Refused ({code}).")
    except ValueError:
        return f"Refused ({code})."
