"""An engine kind registered for one test and removed after it (laneway.engines.kinds): how a
test serves a stand-in engine (tests/standins) through the registry, the admin API and the
CLI, as a plugin's kind would be served. `engine_kind` is the fixture (tests/conftest.py makes
every test able to ask for it); `registered_kind` the same for a wider scope (a module's
gateway)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import pytest
from laneway.engines.kinds import EngineKind, register_engine_kind, unregister_engine_kind


@contextmanager
def registered_kind(kind: EngineKind) -> Iterator[EngineKind]:
    register_engine_kind(kind)
    try:
        yield kind
    finally:
        unregister_engine_kind(kind.name)


@pytest.fixture
def engine_kind() -> Iterator[Callable[[EngineKind], EngineKind]]:
    """Registers the kinds the test hands it; each is removed when the test ends."""
    with ExitStack() as stack:
        yield lambda kind: stack.enter_context(registered_kind(kind))
