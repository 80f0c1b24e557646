"""One test's broken teardown stays that test's error, instead of every later test's.

pytest's SetupState takes a node off its stack before running the node's finalizers and catches
only `Exception`s from them. A fixture finalizer that lets out a bare `BaseException` (a
`GeneratorExit` or `CancelledError` from an async fixture finishing on its event loop) leaves the
module and session nodes on the stack, and every later test on that process then errors at
setup with "previous item was not torn down properly": in a parallel run on 2 cores (2026-12-07)
a `db_engine` teardown's `GeneratorExit` errored some 60 tests of later modules that way. Here the
rest of the stack is torn down as pytest would have, and the escape is reported as the test's
teardown error.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    try:
        return (yield)
    except (KeyboardInterrupt, SystemExit, pytest.exit.Exception):
        raise
    except Exception:
        raise
    except BaseException as escaped:
        error = RuntimeError(f"a fixture's teardown let out {escaped!r}; the rest was torn down")
        try:
            item.session._setupstate.teardown_exact(nextitem)
        except Exception as later:
            error.add_note(f"and then: {later!r}")
        raise error from escaped
