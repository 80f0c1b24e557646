"""The request pipeline after auth: one entry (Gateway.serve), the stages it runs in order,
the Lease that owns what an admitted request holds, and the outcome it leaves to the sinks.
See gateway.py for the order of the stages."""

from laneway.core.pipeline.answers import Client, Completed, Embedded, Streaming
from laneway.core.pipeline.call import CLIENT_CLOSED, Call, CallTrace, engine_request_id
from laneway.core.pipeline.config import GatewayConfig
from laneway.core.pipeline.failover import RetryBudget
from laneway.core.pipeline.gateway import Gateway
from laneway.core.pipeline.intent import EmbeddingIntent, GenerationIntent, Intent
from laneway.core.pipeline.lease import Lease
from laneway.core.pipeline.outcome import Outcome, OutcomeSink
from laneway.core.pipeline.prepare import MAX_EMBEDDING_TOKENS
from laneway.core.pipeline.waiting import DryRun

__all__ = [
    "CLIENT_CLOSED",
    "MAX_EMBEDDING_TOKENS",
    "Call",
    "CallTrace",
    "Client",
    "Completed",
    "DryRun",
    "Embedded",
    "EmbeddingIntent",
    "Gateway",
    "GatewayConfig",
    "GenerationIntent",
    "Intent",
    "Lease",
    "Outcome",
    "OutcomeSink",
    "RetryBudget",
    "Streaming",
    "engine_request_id",
]
