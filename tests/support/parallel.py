"""How `scripts/test` deals the suite out to pytest-xdist's workers.

The unit of work is a module, run whole on one worker: its module-scoped servers start once and
its tests keep their order. The modules of the real vLLM (tests/integration/test_real_vllm*.py)
are one unit: they share one vLLM (session-scoped, minutes to load) and read its counters, which
another worker's requests would move. (xdist's own `--dist loadgroup` cannot say this under
pytest 9: it renames items through `_nodeid`, which pytest 9 no longer reads; this scheduler
splits by node id instead.)

Units start longest first, in the order each worker sorts its collection (the controller keeps
it: --no-loadscope-reorder): the vLLM unit (its worker waits out the load the controller began,
tests/support/vllm_early.py), the other real engines, the browser, the durability tests, the
other slow ones, then the rest as collected.
"""

from __future__ import annotations

from typing import Any

import pytest

VLLM_UNIT = "real_vllm"
VLLM_MODULES = "tests/integration/test_real_vllm"  # the prefix of their node ids
_FIRST = ("real_engine", "browser", "durability", "slow")


def unit_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0]
    return VLLM_UNIT if module.startswith(VLLM_MODULES) else module


def _rank(item: pytest.Item) -> int:
    if unit_of(item.nodeid) == VLLM_UNIT:
        return 0
    for rank, name in enumerate(_FIRST, start=1):
        if item.get_closest_marker(name) is not None:
            return rank
    return len(_FIRST) + 1


@pytest.hookimpl(trylast=True)  # after markers.py has marked, and after -m has deselected
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    uses_vllm = [i.nodeid for i in items if "real_vllm" in getattr(i, "fixturenames", ())]
    strays = [nodeid for nodeid in uses_vllm if unit_of(nodeid) != VLLM_UNIT]
    if strays:
        raise pytest.UsageError(
            f"tests of the real vLLM belong in {VLLM_MODULES}*.py, which run on one worker: {strays[:3]}"
        )
    if hasattr(config, "workerinput"):  # an xdist worker: the controller hands out units in this order
        rank: dict[str, int] = {}
        for item in items:
            unit = unit_of(item.nodeid)
            rank[unit] = min(rank.get(unit, len(_FIRST) + 1), _rank(item))
        items.sort(key=lambda item: rank[unit_of(item.nodeid)])  # stable: a module's tests keep their order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return ModuleScheduling(config, log)
