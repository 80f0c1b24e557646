"""The loop-lag monitor's tick: short under load, long while idle (each tick wakes an idle
gateway), and back to short at once when the load shedder sees the first request again."""

from __future__ import annotations

import asyncio
import time

from laneway.core.load_shedding import LoadShedder
from laneway.core.loop_lag import LoopLagMonitor
from support import until


async def test_idle_ticks_are_long_and_the_first_request_brings_the_short_ones_back() -> None:
    shedder = LoadShedder()
    ticks: list[float] = []
    monitor = LoopLagMonitor(interval_s=0.01, idle_interval_s=0.5, busy=lambda: not shedder.quiet())
    monitor.subscribe(lambda lag: ticks.append(time.perf_counter()))
    shedder.on_wake = monitor.wake
    await monitor.start()
    try:
        await until(lambda: monitor.idle, within=1, what="idle after the first tick")
        assert len(ticks) == 1  # no request: one tick, then the long wait
        await asyncio.sleep(0.2)  # time passing is the point: no tick during the long wait
        assert len(ticks) == 1
        woken_at = time.perf_counter()
        shedder.arrived()  # a request after the quiet spell
        assert not monitor.idle
        await until(lambda: len(ticks) >= 4, within=0.4, what="short ticks")  # before the long wait's end
        assert ticks[1] - woken_at < 0.1  # short ticks from the request on
        await until(lambda: monitor.idle, what="idle again")  # two quiet windows (0.2 s) later: long again
        settled = len(ticks)
        await asyncio.sleep(0.2)  # time passing is the point: at most the tick under way
        assert len(ticks) <= settled + 1
    finally:
        await monitor.stop()


async def test_without_a_busy_signal_it_always_ticks_short() -> None:
    ticks: list[float] = []
    monitor = LoopLagMonitor(interval_s=0.01, on_sample=ticks.append)
    await monitor.start()
    try:
        await until(lambda: len(ticks) >= 5, what="five short ticks")
        assert not monitor.idle
    finally:
        await monitor.stop()


def test_the_shedder_wakes_only_on_the_first_arrival_after_a_quiet_spell() -> None:
    now = [100.0]
    shedder = LoadShedder(clock=lambda: now[0])
    wakes: list[float] = []
    shedder.on_wake = lambda: wakes.append(now[0])
    assert shedder.quiet()
    shedder.arrived()
    assert wakes == [100.0] and not shedder.quiet()
    for _ in range(50):  # steady traffic: 100 a second
        now[0] += 0.01
        shedder.arrived()
    assert wakes == [100.0]
    now[0] += 0.3  # quiet for three windows
    assert shedder.quiet()
    shedder.arrived()
    assert len(wakes) == 2


async def test_an_idle_gateway_is_woken_once_a_second_by_default() -> None:
    """The idle tick is the one wake-up an idle gateway cannot avoid: once a second, not four
    times; a request still brings the short ticks back at once."""
    ticks: list[float] = []
    monitor = LoopLagMonitor(interval_s=0.01, busy=lambda: False, on_sample=ticks.append)
    await monitor.start()
    try:
        await asyncio.sleep(0.8)  # time passing is the point: no second tick within the idle second
        assert monitor.idle and len(ticks) == 1  # the first tick, then one long wait
        monitor.wake()
        await until(lambda: len(ticks) >= 2, within=0.15, what="a tick at the wake")  # not the idle tick at 1 s
    finally:
        await monitor.stop()
