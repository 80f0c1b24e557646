"""The load shedder: a loop delay sheds new API requests only under load, and only for a moment."""

from __future__ import annotations

from laneway.core.load_shedding import LoadShedder, Preparing, current, queued


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_delay_under_load_sheds_for_the_hold_time_then_lets_requests_in_again() -> None:
    clock = Clock()
    s = LoadShedder(max_delay_s=0.05, hold_s=0.05, min_rate=200, clock=clock)
    for _ in range(30):  # 300 requests a second
        s.arrived()
    s.observe(0.01)
    assert not s.overloaded()  # the loop keeps up
    s.observe(0.08)
    assert s.overloaded()
    clock.now += 0.06
    assert not s.overloaded()  # the hold is over: the next delay decides again


def test_a_pause_at_a_low_rate_sheds_nothing() -> None:
    clock = Clock()
    s = LoadShedder(max_delay_s=0.05, min_rate=200, clock=clock)
    for _ in range(3):
        s.arrived()
    s.observe(0.5)  # a garbage collection while three requests arrived
    assert not s.overloaded()


def test_zero_turns_it_off() -> None:
    s = LoadShedder(max_delay_s=0)
    for _ in range(1000):
        s.arrived()
    s.observe(10.0)
    assert not s.enabled and not s.overloaded()


def test_requests_being_prepared_close_the_door_at_the_cap_and_each_leaves_once() -> None:
    s = LoadShedder(max_preparing=2)
    first, second = Preparing(s), Preparing(s)
    assert s.refusal() == "backlog" and s.shed_by == {"backlog": 1, "loop_lag": 0}
    first.done()
    first.done()  # the pipeline, then the protocol at the response's end: counted once
    assert s.preparing == 1 and s.refusal() is None
    token = current.set(second)
    try:
        queued()  # the running request reached an engine's queue
    finally:
        current.reset(token)
    assert s.preparing == 0


def test_the_cap_is_off_with_shedding_or_at_zero() -> None:
    for s in (LoadShedder(max_delay_s=0, max_preparing=1), LoadShedder(max_preparing=0)):
        Preparing(s)
        assert s.refusal() is None
