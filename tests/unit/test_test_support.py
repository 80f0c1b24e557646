"""The suite's own helpers (tests/support): how a parallel run deals out the tests, the waits,
the settable wall clock."""

from __future__ import annotations

import asyncio

import pytest
from support import Wall, until, wait_for
from support.parallel import VLLM_UNIT, unit_of


def test_a_module_is_a_unit_and_the_real_vllms_modules_are_one() -> None:
    assert unit_of("tests/unit/test_slots.py::test_x[a-b]") == "tests/unit/test_slots.py"
    assert unit_of("tests/integration/test_real_vllm.py::test_x") == VLLM_UNIT
    assert unit_of("tests/integration/test_real_vllm_kv_events.py::test_y") == VLLM_UNIT
    assert unit_of("tests/integration/test_real_triton.py::test_z") == "tests/integration/test_real_triton.py"


async def test_until_awaits_a_coroutine_predicate_and_names_what_it_waited_for() -> None:
    polls = []

    async def third_time() -> bool:
        polls.append(1)
        await asyncio.sleep(0)
        return len(polls) == 3

    await until(third_time, step=0)
    assert len(polls) == 3
    with pytest.raises(AssertionError, match=r"the impossible not reached within 0\.05 s"):
        await until(lambda: False, within=0.05, what="the impossible")


def test_wait_for_returns_at_once_when_the_condition_holds() -> None:
    assert wait_for(lambda: True, within=0.001) < 0.001
    with pytest.raises(AssertionError, match="never not reached"):
        wait_for(lambda: False, within=0.01, what="never")


def test_the_wall_clock_reads_what_it_was_set_to() -> None:
    wall = Wall("2026-03-31T23:00:00")
    assert wall() == 1774998000.0
    wall.set("2026-04-01T00:00:00")
    assert wall() == 1774998000.0 + 3600


LEAKY_TEARDOWN = """
import pytest

@pytest.fixture
def leaky():
    yield
    raise GeneratorExit  # a BaseException, as an async fixture finishing on its loop may let out

def test_one(leaky):
    pass
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_a_teardown_letting_out_a_base_exception_errors_its_own_test_only(
    pytester: pytest.Pytester, guarded: bool
) -> None:
    pytester.makepyfile(test_a=LEAKY_TEARDOWN, test_b="def test_two():\n    pass\n\ndef test_three():\n    pass\n")
    plugin = ["-p", "support.teardown"] if guarded else []
    result = pytester.runpytest("-o", "asyncio_default_fixture_loop_scope=function", *plugin)
    if guarded:
        result.assert_outcomes(passed=3, errors=1)
        result.stdout.fnmatch_lines(["*RuntimeError: a fixture's teardown let out GeneratorExit()*"])
    else:  # pytest alone: the next module's first test errors at setup (what support.teardown prevents)
        result.assert_outcomes(passed=2, errors=2)
        result.stdout.fnmatch_lines(["*previous item was not torn down properly*"])
