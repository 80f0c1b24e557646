"""The real vLLM, launched as soon as collection shows a test that needs it, not when that test
comes up: it loads for minutes (2-4.5 on two busy cores), and meanwhile the other tests run.

In one process, the run launches it at the end of collection and the session fixture
(tests/integration/conftest.py: real_vllm) waits for it. Under pytest-xdist the controller
launches it once the first worker has collected, and hands it to the worker that runs the vLLM
tests (one unit: tests/support/parallel.py) through a file named by LANEWAY_TEST_VLLM_HANDOFF,
which the controller sets before the workers start; the controller stops it at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.engines_real import RealVLLM, _unavailable
from support.parallel import VLLM_UNIT, unit_of
from support.waiting import wait_for

HANDOFF = "LANEWAY_TEST_VLLM_HANDOFF"

_launched: RealVLLM | None = None  # in the process that launched it (and stops it)
_refused: str | None = None  # why it could not be launched (not installed)
_launcher: threading.Thread | None = None
_lock = threading.Lock()
_closing = False  # the run is over: launch nothing more


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    """The xdist controller, which starts workers and collects nothing itself."""
    return not _is_worker(config) and config.getoption("dist", default="no") != "no"


def launch_in_background() -> None:
    """Launch it once, on a thread: scripts/install-engines runs first (a no-op once installed,
    but it waits out an install under way), and the run goes on meanwhile."""
    global _launcher
    if _launcher is None:
        workdir = Path(tempfile.mkdtemp(prefix="lw-vllm-"))
        _launcher = threading.Thread(target=_launch, args=(workdir,), name="vllm-early", daemon=True)
        _launcher.start()


def _launch(workdir: Path) -> None:
    global _launched, _refused
    try:
        server = RealVLLM(workdir, kv_events=True)
        with _lock:
            if not _closing:
                _launched = server.launch()
    except (pytest.skip.Exception, pytest.fail.Exception) as exc:  # unavailable(): not installed
        _refused = str(exc.msg)
    except Exception as exc:  # reported by the tests that need it
        _refused = f"vLLM could not be launched: {exc!r}"
    handoff = os.environ.get(HANDOFF)
    if handoff:
        found: dict[str, Any] = {"refused": _refused} if _launched is None else _launched.described()
        Path(handoff + ".tmp").write_text(json.dumps(found))
        os.replace(handoff + ".tmp", handoff)  # whole, or not there yet


def session_server(workdir: Path) -> Iterator[RealVLLM]:
    """For the session fixture: this process's early vLLM, the controller's, or (when nothing
    launched one: a test picked by hand) one launched now; waited for until healthy."""
    owned = False
    handoff = os.environ.get(HANDOFF)
    if _launcher is not None:
        _launcher.join()
        server = _launched
    elif handoff:
        wait_for(lambda: Path(handoff).exists(), within=1800, step=0.2, what="the controller launching vLLM")
        found = json.loads(Path(handoff).read_text())
        if found.get("refused"):
            _unavailable(found["refused"])
        server = RealVLLM.attach(found)
    else:
        server, owned = RealVLLM(workdir, kv_events=True).launch(), True
    if server is None:
        _unavailable(_refused or "vLLM was not launched")
    server.wait_healthy()
    try:
        yield server
    finally:
        if owned:
            server.stop()


# ---- hooks (tests/conftest.py imports them) ----


def pytest_configure(config: pytest.Config) -> None:
    if _is_controller(config) and HANDOFF not in os.environ:  # before the workers start: they inherit it
        os.environ[HANDOFF] = str(Path(tempfile.mkdtemp(prefix="lw-vllm-handoff-")) / "vllm.json")


@pytest.hookimpl(trylast=True)  # after -m has deselected: launch only for tests that run
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _is_worker(config) and any("real_vllm" in getattr(i, "fixturenames", ()) for i in items):
        launch_in_background()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    if any(unit_of(i) == VLLM_UNIT for i in ids):
        launch_in_background()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _closing
    with _lock:  # a launch still installing starts nothing after this
        _closing = True
    if _launched is not None:
        _launched.stop()
        shutil.rmtree(_launched.workdir, ignore_errors=True)
    handoff = os.environ.get(HANDOFF)
    if handoff and _is_controller(config):
        shutil.rmtree(Path(handoff).parent, ignore_errors=True)
