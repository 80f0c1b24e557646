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

How a parallel run (pytest-xdist) deals the tests out to its workers: tests/support/parallel.py.
"""

from __future__ import annotations

import pytest

POSTGRES_FIXTURES = {"pg_database", "pg_database_module", "private_pg"}
REAL_ENGINE_FIXTURES = {"real_vllm", "smollm2_file"}
REAL_ENGINE_MODULES = {
    "test_real_triton",
    "test_cut_tool_calls_smollm2",
    "test_real_demo_model",
    "test_messages_smollm2",
}
DURABILITY_FIXTURES = {"private_pg", "private_redis"}
DURABILITY_MODULES = {"test_batch_durability", "test_database_outage", "test_failover", "test_shutdown"}
# Modules whose tests take seconds each on two cores (pytest --durations), real engines aside.
SLOW_MODULES: set[str] = set()


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


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for name in marks_for(item):
            item.add_marker(name)
