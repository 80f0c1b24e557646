"""Every Prometheus metric laneway exports, defined in one place.

One CollectorRegistry per app (not the process-global one), so several gateways in one
process (tests, benchmarks) never collide. Request metrics are observed once, when a call
finishes; queue gauges are read from the schedulers at scrape time, so the hot path pays
nothing for them. Labels: lane, model, quantization, gpu_type, engine (+ tenant only when
LANEWAY_METRICS_TENANT_LABEL is on: tenants can be many, and cardinality costs memory; the
same rule for the SLO counters, laneway_slo_met_total / laneway_slo_total by lane, slo, alias).

A request refused before it held a lease (auth, validation, unknown model or path, a lane or
model not allowed, ...) has no lane or deployment: it is counted once, by the error handler
that answers it, in laneway_requests_refused_total{endpoint,status,code}. An admitted request
is counted only when its lease is released (laneway_requests_total, by status; a refusal after
admission, such as a 429, also in laneway_rejections_total by reason), so the two counters add
up to every answer and none is counted twice. Not in either: the load shedder's prepared
503s (written before the app: laneway_shed_total) and /health/ready's 503 (a readiness signal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from laneway.contracts.codes import reason_of

if TYPE_CHECKING:
    from laneway.core.pipeline import Outcome

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64)
SEAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ERROR_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)  # |predicted - actual| / actual
BASE_LABELS = ("lane", "model", "quantization", "gpu_type", "engine")

# A runtime reading taken at scrape time: (name, help, "gauge" | "counter", labels, value).
Reading = tuple[str, str, str, dict[str, str], float]


@dataclass(frozen=True, slots=True)
class _Bound:
    e2e: Any
    queue_wait: Any
    ttft: Any
    prefill: Any
    decode: Any
    tpot: Any
    prompt_tokens: Any
    completion_tokens: Any


class GatewayMetrics:
    def __init__(self, *, tenant_label: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tenant_label = tenant_label
        labels = (*BASE_LABELS, "tenant") if tenant_label else BASE_LABELS

        def hist(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, (*labels, *extra), registry=self.registry)

        self.queue_wait = hist("laneway_queue_wait_seconds", "Time from arrival to an engine slot.")
        self.ttft = hist("laneway_time_to_first_token_seconds", "Time from arrival to the first token.")
        self.prefill = hist("laneway_prefill_seconds", "Approximate prefill: from engine slot to first token.")
        self.decode = hist("laneway_decode_seconds", "From the first token to the last.")
        self.tpot = hist("laneway_time_per_output_token_seconds", "Decode time per output token.", TPOT_BUCKETS)
        self.e2e = hist("laneway_request_duration_seconds", "Arrival to the end of the response.")
        self.prompt_tokens = counter("laneway_prompt_tokens_total", "Prompt tokens of requests that ran.")
        self.completion_tokens = counter("laneway_completion_tokens_total", "Tokens generated.")
        self.requests = counter("laneway_requests_total", "Requests by HTTP status.", ("status",))
        self.rejections = counter("laneway_rejections_total", "Refused or cut-short requests.", ("reason",))
        self.refusals = Counter(
            "laneway_requests_refused_total",
            "Error answers to requests that never held a lease, by route (unmatched: no route), status, "
            "error code, method and, for an unmatched route, a normalised path; admitted requests are in "
            "laneway_requests_total instead.",
            ("endpoint", "status", "code", "method", "path"),
            registry=self.registry,
        )
        self.retries = Counter(
            "laneway_retries_total",
            "Requests moved to another replica after theirs failed, before the first byte or mid-answer "
            "(continued: laneway_continuations_total), by alias and why the replica failed (connect, "
            "engine_error, first_token_timeout, inter_token_timeout).",
            ("alias", "reason"),
            registry=self.registry,
        )
        self.continuations = Counter(
            "laneway_continuations_total",
            "Answers continued on another replica after theirs failed mid-answer (a subset of "
            "laneway_retries_total), by alias and why the replica failed (connect, engine_error, "
            "inter_token_timeout).",
            ("alias", "reason"),
            registry=self.registry,
        )
        self.seam = Histogram(
            "laneway_continuation_seam_seconds",
            "A continuation's added latency: from its replica's failure being seen to the first token "
            "the next replica gave (a stall's inter_token_timeout_s comes before it).",
            ("alias",),
            buckets=SEAM_BUCKETS,
            registry=self.registry,
        )
        self.retry_budget_exhausted = Counter(
            "laneway_retry_budget_exhausted_total",
            "Failovers refused because the failed deployment's retry budget was spent: the client got 503.",
            ("alias",),
            registry=self.registry,
        )
        self.routing = Counter(
            "laneway_routing_decisions_total",
            "Requests placed on a replica of an alias with several, by alias, replica and what decided "
            "it: prefix (it held the prompt's prefix), session (its prompt_cache_key), load, hash (a tie), "
            "or the routing setting's name for a baseline that binds at arrival.",
            ("alias", "deployment", "reason"),
            registry=self.registry,
        )
        self.prefix_tokens = Counter(
            "laneway_routing_prefix_tokens_total",
            "Prompt tokens of requests placed by dispatch (kind=prompt) and of those the replica was "
            "estimated to hold cached (kind=estimated): their ratio is the routing's estimated hit rate.",
            ("alias", "deployment", "kind"),
            registry=self.registry,
        )
        self.early_stops = Counter(
            "laneway_early_stops_total",
            "Answers whose decoding laneway ended early (core/early_stops.py), by lane, model and rule: "
            "repetition, json_complete, json_nesting.",
            ("lane", "model", "reason"),
            registry=self.registry,
        )
        self.tokens_saved = Counter(
            "laneway_decode_tokens_saved_total",
            "Decode tokens those early stops saved, estimated against max_tokens (an upper bound: an "
            "answer might have ended sooner on its own).",
            ("lane", "model", "reason"),
            registry=self.registry,
        )
        self.budget_alerts = Counter(
            "laneway_budget_alerts_total",
            "Money budgets whose spend passed the soft threshold (LANEWAY_BUDGET_ALERT_SHARE), once per "
            "budget and period: owner tenant or key, period day or month.",
            ("owner", "period"),
            registry=self.registry,
        )
        self.ttft_prediction_error = Histogram(
            "laneway_ttft_prediction_error",
            "How far off each replica's latency model was on a request's time to first token, "
            "predicted when it took its slot: |predicted - actual| / actual (core/latency/).",
            ("model", "deployment"),
            buckets=ERROR_BUCKETS,
            registry=self.registry,
        )
        self._prediction_errors: dict[tuple[str, str], Any] = {}
        slo_labels = ("lane", "slo", "alias", "tenant") if tenant_label else ("lane", "slo", "alias")
        self.slo_met = Counter(
            "laneway_slo_met_total",
            "Finished requests that met their lane's latency target, by lane, slo (ttft: arrival to the "
            "first token, against the lane's target or the tighter one the request was granted; tpot: time "
            "per output token after the first) and alias; divide by laneway_slo_total for attainment.",
            slo_labels,
            registry=self.registry,
        )
        self.slo_total = Counter(
            "laneway_slo_total",
            "Finished requests judged against a latency target (core/pipeline/outcome.py Outcome.slos_met: "
            "ttft once a token came or laneway failed the request before one, tpot once two came).",
            slo_labels,
            registry=self.registry,
        )
        self._slo_children: dict[tuple[str, ...], tuple[Any, Any]] = {}
        self._children: dict[tuple[str, ...], _Bound] = {}
        self._statuses: dict[tuple[tuple[str, ...], int], Any] = {}
        self._refusals: dict[tuple[str, int, str, str, str], Any] = {}

    def _bound(self, lv: tuple[str, ...]) -> _Bound:
        """The metric children of one label set, looked up once (labels() per observation
        costs more than the observation)."""
        bound = self._children.get(lv)
        if bound is None:
            bound = self._children[lv] = _Bound(
                e2e=self.e2e.labels(*lv),
                queue_wait=self.queue_wait.labels(*lv),
                ttft=self.ttft.labels(*lv),
                prefill=self.prefill.labels(*lv),
                decode=self.decode.labels(*lv),
                tpot=self.tpot.labels(*lv),
                prompt_tokens=self.prompt_tokens.labels(*lv),
                completion_tokens=self.completion_tokens.labels(*lv),
            )
        return bound

    def finished(self, outcome: Outcome) -> None:
        """A finished request's histograms and counters (the pipeline's OutcomeSink)."""
        now = outcome.ended
        lv: tuple[str, ...] = (outcome.lane, outcome.model, outcome.quantization, outcome.gpu_type, outcome.engine)
        if self.tenant_label:
            lv = (*lv, outcome.tenant_name)
        m = self._bound(lv)
        status = self._statuses.get((lv, outcome.status))
        if status is None:
            status = self._statuses[lv, outcome.status] = self.requests.labels(*lv, str(outcome.status))
        status.inc()
        reason = reason_of(outcome.error_code)
        if reason:
            self.rejections.labels(*lv, reason).inc()
        if outcome.failed_tries:  # rare: the labels are looked up here, not cached
            for failed in outcome.moves:
                self.retries.labels(outcome.model, failed.reason).inc()
                if failed.continued:
                    self.continuations.labels(outcome.model, failed.reason).inc()
            for seam in outcome.seam_seconds:
                self.seam.labels(outcome.model).observe(seam)
            if outcome.retry_denied == "budget":
                self.retry_budget_exhausted.labels(outcome.model).inc()
        m.e2e.observe(now - outcome.started)
        for slo, met in outcome.slos_met():
            self._slo(outcome, slo, met)
        if outcome.early_stop is not None:  # per stop, unlike the hot path's: it saved far more
            self.early_stops.labels(outcome.lane, outcome.model, outcome.early_stop).inc()
            self.tokens_saved.labels(outcome.lane, outcome.model, outcome.early_stop).inc(outcome.tokens_saved)
        if outcome.dispatched_at is None:
            return  # never reached the engine
        if outcome.route_reason is not None:
            self._routed(outcome)
        m.queue_wait.observe(outcome.dispatched_at - outcome.started)
        m.prompt_tokens.inc(outcome.prompt_tokens)
        m.completion_tokens.inc(outcome.completion_tokens)
        if outcome.first_token_at is not None:
            m.ttft.observe(outcome.first_token_at - outcome.started)
            if outcome.ttft_prediction_error is not None:
                self._prediction_error(outcome.model, outcome.deployment).observe(outcome.ttft_prediction_error)
            m.prefill.observe(outcome.first_token_at - outcome.dispatched_at)
            decode = now - outcome.first_token_at
            m.decode.observe(decode)
            if outcome.completion_tokens > 1:
                m.tpot.observe(decode / (outcome.completion_tokens - 1))

    def _prediction_error(self, model: str, deployment: str) -> Any:
        child = self._prediction_errors.get((model, deployment))
        if child is None:
            child = self._prediction_errors[model, deployment] = self.ttft_prediction_error.labels(model, deployment)
        return child

    def _slo(self, outcome: Outcome, slo: str, met: bool) -> None:
        key: tuple[str, ...] = (outcome.lane, slo, outcome.model)
        if self.tenant_label:
            key = (*key, outcome.tenant_name)
        children = self._slo_children.get(key)
        if children is None:
            # Both made at once: a label set with none met is exported at 0 (attainment 0, not "no data").
            children = self._slo_children[key] = (self.slo_met.labels(*key), self.slo_total.labels(*key))
        if met:
            children[0].inc()
        children[1].inc()

    def _routed(self, outcome: Outcome) -> None:
        key = (outcome.model, outcome.deployment)
        self.routing.labels(*key, outcome.route_reason).inc()
        self.prefix_tokens.labels(*key, "prompt").inc(outcome.prompt_tokens)
        if outcome.cached_estimate:
            self.prefix_tokens.labels(*key, "estimated").inc(outcome.cached_estimate)

    def refused(self, endpoint: str, status: int, code: str | None, method: str = "", path: str = "") -> None:
        """One error answer to a request that never held a lease. `endpoint` is a route's path
        template, `method` one of a fixed few and `path` (unmatched routes) one of a fixed
        list (api/errors.py): bounded, never the raw path."""
        key = (endpoint, status, code or "", method, path)
        child = self._refusals.get(key)
        if child is None:
            child = self._refusals[key] = self.refusals.labels(endpoint, str(status), code or "", method, path)
        child.inc()

    def watch_queues(self, source: Callable[[], Iterable[tuple[dict[str, str], int, int]]]) -> None:
        """Expose waiting/running per lane and deployment, read from `source` at scrape time."""
        self.registry.register(_QueueCollector(source))

    def watch(self, source: Callable[[], Iterable[Reading]]) -> None:
        """Expose readings of runtime state (dependency faults, usage backlog) at scrape time."""
        self.registry.register(_ReadingsCollector(source))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _QueueCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[tuple[dict[str, str], int, int]]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        names = ("lane", "deployment", "model", "quantization", "gpu_type", "engine")
        waiting = GaugeMetricFamily(
            "laneway_requests_waiting", "Requests queued for an engine slot (the autoscaling signal).", labels=names
        )
        running = GaugeMetricFamily("laneway_requests_running", "Requests holding an engine slot.", labels=names)
        for labels, n_waiting, n_running in self._source():
            values = [labels[n] for n in names]
            waiting.add_metric(values, n_waiting)
            running.add_metric(values, n_running)
        yield waiting
        yield running


class _ReadingsCollector(Collector):
    def __init__(self, source: Callable[[], Iterable[Reading]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        families: dict[str, Any] = {}
        for name, doc, kind, labels, value in self._source():
            family = families.get(name)
            if family is None:
                cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
                family = families[name] = cls(name, doc, labels=sorted(labels))
            family.add_metric([labels[k] for k in sorted(labels)], value)
        yield from families.values()
