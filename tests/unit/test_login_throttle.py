"""The login throttle's arithmetic on a fake clock, and the password verifier's bound."""

from __future__ import annotations

import asyncio

import pytest
from laneway.admin.security import PasswordVerifier, hash_password
from laneway.admin.throttle import LoginThrottle
from laneway.contracts.errors import GatewayError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(throttle: LoginThrottle, user: str = "admin", address: str = "10.0.0.1") -> None:
    throttle.begin(user, address).finish(False)


def locked_for(throttle: LoginThrottle, user: str = "admin", address: str = "10.0.0.1") -> float:
    try:
        throttle.begin(user, address).finish(None)
    except GatewayError as exc:
        assert exc.status == 429 and exc.code == "too_many_login_attempts"
        return float(exc.headers["Retry-After"])
    return 0.0


def test_five_failures_then_a_lock_that_doubles_up_to_fifteen_minutes() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(4):
        fail(throttle)
    assert locked_for(throttle) == 0
    fail(throttle)
    waits = []
    for _ in range(14):
        waits.append(locked_for(throttle))
        clock.now += waits[-1]
        fail(throttle)
    assert waits[:6] == [1, 2, 4, 8, 16, 32] and max(waits) == 900 and waits[-1] == 900


def test_failures_are_forgotten_fifteen_minutes_after_the_last_lock() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    for _ in range(6):
        clock.now += 10
        fail(throttle)
    clock.now += 2 + 900 + 1
    for _ in range(4):  # a fresh allowance
        fail(throttle)
    assert locked_for(throttle) == 0


def test_a_success_clears_the_username_and_makes_the_address_familiar() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock=clock)
    throttle.begin("admin", "10.0.0.1").finish(True)  # the admin's usual address
    for n in range(5):
        fail(throttle, address=f"10.9.0.{n}")  # one failure from each of five addresses
    assert locked_for(throttle, address="10.9.0.99") > 0  # the username is locked for strangers
    assert locked_for(throttle, address="10.0.0.1") == 0  # not where the admin logs in from
    throttle.begin("admin", "10.0.0.1").finish(True)
    assert locked_for(throttle, address="10.9.0.99") == 0  # the success cleared the username


def test_concurrent_attempts_count_against_the_allowance() -> None:
    throttle = LoginThrottle(clock=Clock())
    attempts = [throttle.begin("admin", "10.0.0.1") for _ in range(5)]
    with pytest.raises(GatewayError):
        throttle.begin("admin", "10.0.0.1")  # five checks already under way
    for a in attempts:
        a.finish(None)  # never checked: no failure counted
    assert locked_for(throttle) == 0


def test_memory_stays_bounded_under_a_username_spray() -> None:
    throttle = LoginThrottle(clock=Clock(), max_entries=100)
    for n in range(1000):
        fail(throttle, user=f"user{n}", address=f"10.1.{n // 250}.{n % 250}")
    assert len(throttle._records) <= 101


async def test_the_verifier_refuses_beyond_its_backlog_and_counts_finished_checks() -> None:
    verifier = PasswordVerifier(threads=1, max_pending=2)
    try:
        stored = await verifier.hash("correct horse battery")
        first = verifier.submit(stored, "correct horse battery")
        second = verifier.submit(stored, "wrong")
        with pytest.raises(GatewayError) as info:
            verifier.submit(stored, "third")
        assert info.value.status == 429 and info.value.code == "login_busy"
        assert await asyncio.shield(first) is True and await second is False
        assert verifier.pending == 0 and verifier.refused == 1
        with pytest.raises(ValueError):
            hash_password("short")
    finally:
        verifier.close()
