"""Marks each collected test by what it needs, so a run can pick (pyproject registers the
markers; docs/testing.md says which run when): by the fixtures it uses and where it lives,
not by a line in each module, so a new test that uses the real vLLM or PostgreSQL is marked
without anyone remembering to.

- postgres: the shared PostgreSQL (a "postgres" parameter, a throwaway database) or a private
  cluster.
- real_engine: a real engine process or model (vLLM, Triton, SmolLM2 on llama.cpp).
- browser: Chromium through Playwright (tests/e2e).
- durability: several processes or private services killed, frozen and restarted.
- slow: all of the above but postgres, and the modules that take seconds a test (timed with
  --durations); `scripts/test quick` leaves these out.

Under pytest-xdist the tests of the real vLLM are one group (`xdist_group`), run on one
worker: they share one vLLM (session-scoped, two minutes to load) and read its counters.
"""

from __future__ import annotations

import pytest

POSTGRES_FIXTURES = {"pg_database", "pg_database_module", "private_pg"}
REAL_ENGINE_FIXTURES = {"real_vllm", "smollm2_file"}
REAL_ENGINE_MODULES = {"test_real_triton", "test_cut_tool_calls_smollm2", "test_real_demo_model"}
DURABILITY_FIXTURES = {"private_pg", "private_redis"}
DURABILITY_MODULES = {"test_batch_durability", "test_database_outage", "test_failover", "test_shutdown"}
# Modules whose tests take seconds each on two cores (pytest --durations), real engines aside.
SLOW_MODULES: set[str] = set()

VLLM_GROUP = "real_vllm"


def marks_for(item: pytest.Item) -> list[str]:
    fixtures = set(getattr(item, "fixturenames", ()))
    module = item.path.stem
    params = getattr(getattr(item, "callspec", None), "params", {})
    marks = []
    if fixtures & POSTGRES_FIXTURES or "postgres" in params.values():
        marks.append("postgres")
    if fixtures & REAL_ENGINE_FIXTURES or module in REAL_ENGINE_MODULES:
        marks.append("real_engine")
    if "e2e" in item.path.parts:
        marks.append("browser")
    if fixtures & DURABILITY_FIXTURES or module in DURABILITY_MODULES:
        marks.append("durability")
    if {"real_engine", "browser", "durability"} & set(marks) or module in SLOW_MODULES:
        marks.append("slow")
    return marks


# Under xdist, units of work (a module, or the vLLM group) start longest first: the vLLM group
# (its worker waits out the load the controller began, tests/support/vllm_early.py), then the
# other real engines, the browser, the durability tests, then the rest as collected.
_FIRST = ("real_engine", "browser", "durability", "slow")


def _rank(item: pytest.Item) -> int:
    if "real_vllm" in getattr(item, "fixturenames", ()):
        return 0
    for rank, name in enumerate(_FIRST, start=1):
        if item.get_closest_marker(name) is not None:
            return rank
    return len(_FIRST) + 1


def _longest_first(items: list[pytest.Item]) -> None:
    """Modules (whole: their tests keep their order) by the rank of their first-ranked test."""
    rank: dict[str, int] = {}
    for item in items:
        unit = _unit(item)
        rank[unit] = min(rank.get(unit, len(_FIRST) + 1), _rank(item))
    items.sort(key=lambda item: rank[_unit(item)])  # stable


def _unit(item: pytest.Item) -> str:
    mark = item.get_closest_marker("xdist_group")
    return f"@{mark.args[0]}" if mark is not None else item.nodeid.split("::", 1)[0]


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks, and before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in marks_for(item):
            item.add_marker(name)
        if "real_vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(VLLM_GROUP))
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out units in this order
        _longest_first(items)
