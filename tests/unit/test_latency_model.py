"""The per-replica latency model (core/latency/), driven with synthetic observations from a
known curve on a fake clock: it learns the curve (within 10 %), a few 10x outliers barely move
it, a replica that becomes 3x slower is relearned within a minute, and its bookkeeping of a
request's attempt (the batch it ran in, the prompts that joined meanwhile) is exact."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from laneway.core.latency import DecayedFit, LatencyModels, ReplicaLatencyModel, curve_points
from laneway.engines.base import EngineLoad


@dataclass(frozen=True)
class Curve:
    """A replica's true latency: TTFT and decode step time in seconds."""

    overhead: float = 0.004
    prefill: float = 40e-6  # per uncached prompt token
    queued: float = 30e-6  # per uncached token queued ahead
    ttft_per_running: float = 0.003
    base: float = 0.020
    per_seq: float = 0.005
    per_kv: float = 0.0

    def ttft(self, uncached: float, batch: float, ahead: float = 0.0) -> float:
        return self.overhead + self.prefill * uncached + self.queued * ahead + self.ttft_per_running * batch

    def step(self, batch: float, kv: float = 0.0) -> float:
        return self.base + self.per_seq * batch + self.per_kv * kv

    def slower(self, factor: float) -> Curve:
        fields = (self.overhead, self.prefill, self.queued, self.ttft_per_running, self.base, self.per_seq)
        return Curve(*(factor * v for v in fields))


def feed(
    model: ReplicaLatencyModel,
    curve: Curve,
    start: float,
    seconds: float,
    *,
    rate: float = 10.0,
    noise: float = 0.05,
    rng: random.Random,
    kv: bool = False,
) -> float:
    """`rate` requests a second for `seconds` from `start`, each observed as it ends: its TTFT
    and its decoding, with multiplicative noise of +-`noise`. Returns the clock at the end."""
    now = start
    while now < start + seconds:
        now += rng.expovariate(rate)
        uncached, ahead, batch = rng.randint(0, 4000), rng.choice((0, rng.randint(0, 8000))), rng.uniform(1, 16)
        usage = rng.uniform(0.1, 0.9) if kv else 0.0
        jitter = 1 + rng.uniform(-noise, noise)
        model.observe_ttft(now, uncached, ahead, batch, curve.ttft(uncached, batch, ahead) * jitter)
        model.observe_decode(now, 31, curve.step(batch, usage) * jitter, batch, usage)
    return now


def close(learned: float | None, true: float, within: float = 0.10) -> bool:
    return learned is not None and abs(learned - true) <= within * abs(true)


def assert_learned(model: ReplicaLatencyModel, curve: Curve, within: float = 0.10, queued: bool = True) -> None:
    r = model.readings(0.0)
    assert close(r.prefill_s_per_token, curve.prefill, within), (r.prefill_s_per_token, curve.prefill)
    for n in (1, 4, 8, 16):
        assert close(r.step_at(n), curve.step(n), within), (n, r.step_at(n), curve.step(n))
        assert close(model.predict_ttft(2000, running=n - 1), curve.ttft(2000, n), within)
        if queued:  # it saw prompts queued ahead
            assert close(model.predict_ttft(2000, 3000, running=n - 1), curve.ttft(2000, n, 3000), within)


def test_it_learns_a_step_curve_and_a_prefill_rate_from_a_known_curve() -> None:
    model, curve = ReplicaLatencyModel(), Curve()
    assert model.readings().prefill_s_per_token is None and model.predict_step(4) is None  # nothing yet
    feed(model, curve, 0.0, 30.0, rng=random.Random(1))
    assert_learned(model, curve, within=0.05)
    r = model.readings(0.0)
    assert close(r.step_base_s, curve.base, 0.05) and close(r.step_s_per_seq, curve.per_seq, 0.05)
    assert r.step_s_per_kv is None  # the engine reported no KV use: no KV term shown


def test_a_few_10x_outliers_move_it_by_a_few_percent_at_most() -> None:
    rng = random.Random(2)
    model, curve = ReplicaLatencyModel(), Curve()
    now = feed(model, curve, 0.0, 30.0, rng=rng)
    before = model.readings(now)
    for _ in range(3):  # three requests that took 10x as long: a pause, a stuck client
        now += 0.1
        model.observe_ttft(now, 1000, 0, 4, 10 * curve.ttft(1000, 4))
        model.observe_decode(now, 31, 10 * curve.step(4), 4)
    after = model.readings(now)
    assert model.ttft.shifts == model.step.shifts == 0  # no change of engine was seen in them
    assert close(after.prefill_s_per_token, before.prefill_s_per_token or 0, 0.03)
    for n in (1, 8, 16):
        assert close(after.step_at(n), before.step_at(n) or 0, 0.03)
        assert close(model.predict_ttft(1000, running=n - 1), curve.ttft(1000, n), 0.05)


@pytest.mark.parametrize("factor", [3.0, 1 / 3], ids=["3x slower", "3x faster"])
def test_a_replica_whose_speed_changes_3x_is_relearned_within_a_minute(factor: float) -> None:
    rng = random.Random(3)
    model, curve = ReplicaLatencyModel(), Curve()
    now = feed(model, curve, 0.0, 60.0, rate=5.0, rng=rng)
    changed = curve.slower(factor)
    feed(model, changed, now, 60.0, rate=5.0, rng=rng)  # a minute after the change
    assert_learned(model, changed)
    assert model.ttft.shifts >= 1 and model.step.shifts >= 1  # seen as a change, not waited out


def test_idle_time_changes_no_prediction() -> None:
    """The decay scales every sum alike: a replica nobody used for an hour predicts as before."""
    model, curve = ReplicaLatencyModel(), Curve()
    now = feed(model, curve, 0.0, 20.0, rng=random.Random(4))
    before = (model.predict_step(8), model.predict_ttft(1000, running=3))
    model.observe_decode(now + 3600, 31, curve.step(8), 8)
    model.observe_ttft(now + 3600, 1000, 0, 4, curve.ttft(1000, 4))
    assert close(model.predict_step(8), before[0] or 0, 0.01)
    assert close(model.predict_ttft(1000, running=3), before[1] or 0, 0.01)
    assert model.readings(now + 3600).ttft_weight < 2  # what it has to go on is then this one request


def test_kv_use_is_learned_where_the_engine_reports_it() -> None:
    model, curve = ReplicaLatencyModel(), Curve(per_kv=0.030)
    model.kv_reported = True
    feed(model, curve, 0.0, 30.0, rng=random.Random(5), kv=True, noise=0.02)
    r = model.readings(0.0)
    assert close(r.step_s_per_kv, curve.per_kv, 0.10)
    assert close(r.step_at(8, 0.5), curve.step(8, 0.5), 0.05)


def test_decoding_less_the_prefill_of_prompts_that_joined_is_the_step() -> None:
    """A step that admits a prompt is longer by its prefill: that is not the step curve's."""
    model, curve = ReplicaLatencyModel(), Curve()
    rng = random.Random(6)
    now = 0.0
    for _ in range(300):
        now += 0.1
        uncached, batch, joined = rng.randint(0, 4000), rng.uniform(1, 16), rng.randint(0, 20_000)
        model.observe_ttft(now, uncached, 0, batch, curve.ttft(uncached, batch))
        gap = curve.step(batch) + curve.prefill * joined / 31  # 31 gaps; `joined` tokens prefilled meanwhile
        model.observe_decode(now, 31, gap, batch, joined_tokens=joined)
    assert_learned(model, curve, within=0.03, queued=False)


class Recording(ReplicaLatencyModel):
    """The model, keeping what each attempt reported to it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, tuple[float, ...]]] = []

    def observe_ttft(self, now: float, uncached_tokens: float, ahead: float, batch: float, ttft_s: float) -> None:
        self.seen.append(("ttft", (uncached_tokens, ahead, batch, ttft_s)))
        super().observe_ttft(now, uncached_tokens, ahead, batch, ttft_s)

    def observe_decode(
        self, now: float, gaps: int, mean_gap_s: float, batch: float, kv_usage: float = 0.0, joined_tokens: float = 0.0
    ) -> None:
        self.seen.append(("decode", (gaps, mean_gap_s, batch, kv_usage, joined_tokens)))
        super().observe_decode(now, gaps, mean_gap_s, batch, kv_usage, joined_tokens)


def test_an_attempt_measures_the_batch_it_ran_in_and_the_prompts_that_joined() -> None:
    model = Recording()
    a = model.begin(0.0, prompt_tokens=500, cached_tokens=100)  # alone
    assert (model.running, a.batch, a.predicted) == (1, 1.0, None)  # nothing learned: no prediction
    a.first_token(0.1)
    b = model.begin(0.5, prompt_tokens=300)  # from here two run, until b ends at 1.1
    assert b.batch == 2.0
    b.first_token(0.6)
    b.end(300, 11, True, now=1.1)
    a.end(520, 11, True, now=1.3)  # the engine counted 520 prompt tokens: 420 uncached
    assert model.running == 0
    # a decoded alone, then beside b waiting for its first token (half a sequence), then beside
    # b decoding, then alone again; b's 300 tokens were prefilled meanwhile.
    a_decode = (10, 0.12, (0.4 * 1 + 0.1 * 1.5 + 0.5 * 2 + 0.2 * 1) / 1.2, 0.0, 300.0)
    assert model.seen == [
        ("ttft", (300, 0, 2.0, pytest.approx(0.1))),
        ("decode", pytest.approx((10, 0.05, 2.0, 0.0, 0.0))),
        ("ttft", (420, 0, 1.0, 0.1)),
        ("decode", pytest.approx(a_decode)),
    ]
    b.end(300, 11, True, now=2.0)  # idempotent: a lease may end its generation twice
    assert model.running == 0 and len(model.seen) == 4


def test_an_attempt_without_a_first_token_only_leaves() -> None:
    model = ReplicaLatencyModel()
    a = model.begin(0.0, prompt_tokens=100)
    a.end(100, 0, False, now=0.2)  # the client left while it waited, or the engine failed
    assert model.running == 0 and model.ttft.count == 0 and model.service.count == 0


def test_the_prediction_at_dispatch_and_its_error() -> None:
    model, curve = ReplicaLatencyModel(), Curve()
    now = feed(model, curve, 0.0, 20.0, rng=random.Random(7), noise=0.0)
    a = model.begin(now, prompt_tokens=3000, cached_tokens=1000)  # alone: a batch of 1
    assert a.predicted == pytest.approx(curve.ttft(2000, 1), rel=0.02)
    a.first_token(now + 2 * curve.ttft(2000, 1))  # it took twice as long
    assert a.error == pytest.approx(0.5, rel=0.05)  # |p - 2p| / 2p
    assert model.readings(now).ttft_error == pytest.approx(0.5, rel=0.05)


def test_prompts_queued_ahead_count_as_prefill_before_its_own() -> None:
    model = Recording()
    a = model.begin(0.0, prompt_tokens=1000)
    b = model.begin(0.01, prompt_tokens=600, cached_tokens=100)
    assert (a.ahead, b.ahead, model.pending_prefill) == (0, 1000, 1500)
    a.first_token(0.05)  # prefilled: no longer ahead of anyone
    c = model.begin(0.06, prompt_tokens=10)
    assert c.ahead == 500
    c.end(10, 0, False, now=0.07)  # it left before its first token: its tokens are not waiting any more
    b.first_token(0.1)
    assert model.pending_prefill == 0
    b.end(600, 1, True, now=0.1)
    assert ("ttft", (500, 1000, 2.0, pytest.approx(0.09))) in model.seen  # its 500 behind a's 1000


def test_the_prediction_counts_what_is_queued_ahead() -> None:
    model, curve = ReplicaLatencyModel(), Curve()
    feed(model, curve, 0.0, 20.0, rng=random.Random(8), noise=0.0)
    assert model.predict_ttft(1000, queue_ahead=2000, running=3) == pytest.approx(curve.ttft(1000, 4, 2000), rel=0.02)


def test_a_full_replicas_wait_is_its_slots_freeing_a_service_time_apart() -> None:
    model = ReplicaLatencyModel()
    assert model.predict_wait(2, 4) is None
    for i in range(10):
        model.observe_service(i * 0.01, 0.8)  # requests hold their slot 0.8 s
    assert model.predict_wait(2, running=4) == pytest.approx(2 * 0.8 / 4)


def test_the_engines_reported_load_counts_where_it_is_more() -> None:
    """vLLM fed by other gateways too: its reported running is the batch, its KV use is kept."""
    model = Recording()
    load = EngineLoad(running=6, waiting=0, kv_usage=0.4)
    a = model.begin(0.0, prompt_tokens=100, reported=lambda: load)
    assert a.batch == 7 and model.kv_reported  # six running there, and itself
    a.first_token(0.05)
    a.end(100, 5, True, now=0.25)
    assert model.seen[-1] == ("decode", (4, pytest.approx(0.05), pytest.approx(6.0), pytest.approx(0.4), 0.0))


def test_models_are_kept_by_deployment_name() -> None:
    models = LatencyModels()
    assert models.of("a") is models.of("a") and models.of("a") is not models.of("b")
    assert set(models.readings()) == {"a", "b"}


def test_the_curve_is_shown_at_a_few_batch_sizes() -> None:
    assert curve_points(16) == [1, 4, 8, 16]
    assert curve_points(1) == [1]
    assert curve_points(3) == [1, 3]


def test_the_fit_clips_an_outlier_once_it_has_data() -> None:
    fit = DecayedFit(1, 15.0)
    for i in range(20):
        fit.add(i * 0.1, (), 1.0 + (0.01 if i % 2 else -0.01))
    fit.add(2.0, (), 100.0)
    assert fit.clipped == 1
    assert fit.predict(()) == pytest.approx(1.0, rel=0.06)
    with pytest.raises(ValueError):
        DecayedFit(5, 1.0)
