"""The retry budget: a share of a deployment's requests over a sliding window, never fewer than
its minimum, counted per deployment."""

from __future__ import annotations

from laneway.core.pipeline import RetryBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_minimum_holds_for_a_quiet_deployment_and_then_it_is_spent() -> None:
    budget = RetryBudget(ratio=0.1, minimum=2, window_s=10, clock=Clock())
    budget.requested("a")
    assert [budget.spend("a") for _ in range(3)] == [True, True, False]


def test_the_share_of_requests_grows_the_budget() -> None:
    budget = RetryBudget(ratio=0.1, minimum=1, window_s=10, clock=Clock())
    for _ in range(50):
        budget.requested("a")
    assert sum(budget.spend("a") for _ in range(10)) == 5


def test_deployments_have_their_own_budgets() -> None:
    budget = RetryBudget(ratio=0.0, minimum=1, window_s=10, clock=Clock())
    assert budget.spend("a") and not budget.spend("a")
    assert budget.spend("b")


def test_the_window_slides() -> None:
    clock = Clock()
    budget = RetryBudget(ratio=0.0, minimum=1, window_s=5, clock=clock)
    assert budget.spend("a") and not budget.spend("a")
    clock.now += 4
    assert not budget.spend("a")
    clock.now += 2  # the first retry's second has left the window
    assert budget.spend("a")
