"""The load shedder: a loop delay sheds new API requests only under load, and only for a moment."""

from __future__ import annotations

from laneway.core.load_shedding import LoadShedder, Preparing, current, queued, waiting_elsewhere


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
    assert s.refusal() == "backlog" and s.shed_by == {"cpu": 0, "backlog": 1, "loop_lag": 0}
    first.done()
    first.done()  # the pipeline, then the protocol at the response's end: counted once
    assert s.preparing == 1 and s.refusal() is None
    token = current.set(second)
    try:
        queued()  # the running request reached an engine's queue
    finally:
        current.reset(token)
    assert s.preparing == 0


def test_a_burst_gets_the_high_cap_and_a_backlog_that_stands_the_low_one() -> None:
    """A client's 40 requests at once all get in (under the hard cap of 64) and drain; a flood
    that keeps arrivals finding 16 ahead of them for standing_s gets the low cap until the
    pressure leaves a gap of standing_s."""
    clock = Clock()
    s = LoadShedder(max_preparing=64, standing_preparing=16, standing_s=0.1, clock=clock)

    def arrive() -> Preparing | None:
        if s.refusal() is not None:
            return None
        return Preparing(s)

    burst = [arrive() for _ in range(40)]  # one read: all in, though 24 found 16 ahead
    assert None not in burst and s.preparing == 40
    more = [arrive() for _ in range(30)]
    assert more.count(None) == 6  # the hard cap still holds at 64
    clock.now += 0.05
    for token in burst + [t for t in more if t is not None]:
        assert token is not None
        token.done()  # drained in 50 ms
    clock.now += 0.2  # quiet: the next arrivals start a new episode
    burst = [arrive() for _ in range(40)]
    assert None not in burst
    for token in burst:
        assert token is not None
        token.done()
    # A flood: the backlog keeps at 16 or more, arrivals every millisecond.
    admitted = [t for t in (arrive() for _ in range(16)) if t is not None]
    refused_before = s.shed_by["backlog"]
    for _ in range(99):  # 99 ms of pressure, under standing_s: the high cap
        clock.now += 0.001
        token = arrive()
        assert token is not None
        admitted.append(token)
        admitted.pop(0).done()
    assert s.shed_by["backlog"] == refused_before and s.preparing == 16
    clock.now += 0.002
    assert arrive() is None  # it stood for standing_s: a flood, refused above 16
    for token in admitted[:4]:
        token.done()
    assert arrive() is not None  # room under the low cap: let in
    assert arrive() is not None and arrive() is not None and arrive() is not None
    assert arrive() is None  # 16 again: refused (pressure seen, the flood goes on)
    clock.now += 0.15  # a gap in the pressure longer than standing_s: the high cap again
    assert arrive() is not None


def test_the_cap_is_off_with_shedding_or_at_zero() -> None:
    for s in (LoadShedder(max_delay_s=0, max_preparing=1), LoadShedder(max_preparing=0)):
        Preparing(s)
        assert s.refusal() is None


def _tick(s: LoadShedder, wall: Clock, cpu: Clock, busy: float, arrivals: int = 30, lag_s: float = 0.0) -> None:
    """One 50 ms tick of the loop-lag monitor in which the loop's thread was `busy` of the time
    while `arrivals` API requests came in (30 per tick: 600 a second)."""
    for _ in range(arrivals):
        s.arrived()
    wall.now += 0.05
    cpu.now += 0.05 * busy
    s.tick(lag_s)


def test_a_saturated_loop_lets_in_only_the_share_that_keeps_it_at_its_cpu_target() -> None:
    wall, cpu = Clock(), Clock()
    s = LoadShedder(cpu_target=0.9, clock=wall, cpu_clock=cpu)
    _tick(s, wall, cpu, 0.5)  # the first tick only starts the measurement
    assert s.admit == 1.0 and s.refusal() is None
    # Demand at 5x what the loop can do: busy = min(1, 5 * admitted share).
    busy_seen = []
    for _ in range(30):
        _tick(s, wall, cpu, min(1.0, 5 * s.admit), lag_s=0.03 if s.admit > 0.3 else 0.0)
        busy_seen.append(min(1.0, 5 * s.admit))
    assert 0.16 <= s.admit <= 0.19, s.admit  # ~0.9 / 5: the loop at its target, not behind
    assert all(0.8 <= b <= 0.95 for b in busy_seen[-10:]), busy_seen
    # Admitting is deterministic: of 1,000 new requests, the admitted share gets in.
    refused = [s.refusal() for _ in range(1000)]
    assert abs(refused.count(None) - 1000 * s.admit) <= 1
    assert set(refused) == {None, "cpu"} and s.shed_by["cpu"] == refused.count("cpu")


def test_the_door_opens_again_as_soon_as_the_loop_has_room() -> None:
    wall, cpu = Clock(), Clock()
    s = LoadShedder(cpu_target=0.9, clock=wall, cpu_clock=cpu)
    for _ in range(10):
        _tick(s, wall, cpu, 1.0, lag_s=0.1)
    assert s.admit < 0.05  # closed down to (about) its floor, never to zero
    assert s.admit >= 0.02
    for _ in range(4):  # the flood stopped: the loop idles at 10 % with the same arrivals
        _tick(s, wall, cpu, 0.1)
    assert s.admit == 1.0 and s.refusal() is None


def test_a_busy_loop_at_a_low_rate_refuses_nothing_and_zero_turns_the_cpu_signal_off() -> None:
    wall, cpu = Clock(), Clock()
    s = LoadShedder(cpu_target=0.9, min_rate=200, clock=wall, cpu_clock=cpu)
    for _ in range(10):
        _tick(s, wall, cpu, 1.0, arrivals=2)  # a long prompt's templating while 40 requests/s arrive
    assert s.admit == 1.0
    off = LoadShedder(cpu_target=0, clock=wall, cpu_clock=cpu)
    for _ in range(10):
        _tick(off, wall, cpu, 1.0, lag_s=0.01)
    assert off.admit == 1.0 and off.refusal() is None


def test_a_token_counts_from_its_start_and_not_while_it_waits_elsewhere() -> None:
    s = LoadShedder()
    token = Preparing(s, counting=False)  # its body still coming
    ctx = current.set(token)
    try:
        with waiting_elsewhere():  # not counted before: not counted after
            assert s.preparing == 0
        assert s.preparing == 0
        token.start()
        token.start()  # idempotent
        assert s.preparing == 1
        with waiting_elsewhere():
            assert s.preparing == 0
        assert s.preparing == 1
        with waiting_elsewhere():
            token.done()  # ended while waiting (queued, or its connection gone): stays ended
        assert s.preparing == 0
        token.start()
        assert s.preparing == 0
    finally:
        current.reset(ctx)


def test_calm_means_no_refusal_and_has_no_side_effects() -> None:
    """The door skips its parser-free refusal while the shedder is calm: calm must never hold
    while refusal() would refuse, and asking it changes nothing."""
    clock = Clock()
    s = LoadShedder(max_preparing=8, standing_preparing=4, standing_s=0.1, clock=clock)
    assert s.calm()
    tokens = [Preparing(s) for _ in range(3)]
    assert s.calm() and s.shed == 0
    tokens.append(Preparing(s))  # the low cap's worth ahead: pressure, not yet a refusal
    assert not s.calm() and s.shed == 0 and s._pressure_since < 0  # nothing recorded by asking
    for t in tokens:
        t.done()
    assert s.calm()
    s.admit = 0.5  # the cpu signal lets in half
    assert not s.calm()
    s.admit = 1.0
    s._until = clock() + 0.05  # a loop-lag hold
    assert not s.calm() and s.refusal() == "loop_lag"
    clock.now += 0.06
    assert s.calm() and s.refusal() is None
    for n in range(12):  # every backlog size: calm implies no refusal
        s.preparing = n
        for _ in range(3):
            calm = s.calm()
            assert not (calm and s.refusal() is not None), n
            clock.now += 0.06
    s.preparing = 0
    assert LoadShedder(max_delay_s=0).calm()  # shedding off
