"""Each dependency's private API is touched from one fenced module at most, with a pinned version
range and its own contract test (docs/decisions/). This test keeps the fences where they are:
an import of a dependency's private module, or of an undocumented internal one, anywhere else
fails, and so does a fenced dependency whose pin lost its upper bound. Every dependency the
package imports is named in pyproject.toml itself, not reached through another's extra."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "platform" / "laneway"

# dependency -> (the one module allowed past its public API, the internal modules it may use,
# its contract test)
FENCES = {
    "uvicorn": ("server/uvicorn_fence.py", ("uvicorn.protocols", "uvicorn.server"), "test_uvicorn_fence.py"),
    "llama_cpp": ("engines/llamacpp/lowlevel.py", ("llama_cpp._internals",), "test_llamacpp_internals.py"),
}
# The distribution each fenced module comes from, as pyproject.toml names it.
DISTRIBUTIONS = {"uvicorn": "uvicorn", "llama_cpp": "llama-cpp-python"}


def third_party_imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    return [n for n in names if not n.startswith(("laneway", "__future__"))]


def is_private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split(".")[1:])


def test_private_or_internal_imports_only_inside_their_fence() -> None:
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for name in third_party_imports(path):
            top = name.split(".")[0]
            fence = FENCES.get(top)
            internal = fence is not None and name.startswith(fence[1])
            if (is_private(name) or internal) and (fence is None or where != fence[0]):
                outside.append(f"{where}: {name}")
    assert outside == []


def test_each_fence_has_its_module_its_contract_test_and_a_pinned_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    pins = {Requirement(r).name: Requirement(r).specifier for r in requirements if not r.startswith("laneway")}
    for top, (module, _, contract) in FENCES.items():
        assert (PACKAGE / module).is_file(), module
        assert (ROOT / "tests" / "unit" / contract).is_file(), contract
        specifier = pins[DISTRIBUTIONS[top]]
        assert any(s.operator in ("<", "<=", "==", "~=") for s in specifier), f"{top} needs an upper bound"


def test_every_imported_dependency_is_declared_by_name() -> None:
    """hiredis was imported (core/redis_hub/) but came only through `redis[hiredis]`, grpcio
    (engines/trtllm.py) only through `tritonclient[grpc]` (issue 37): a dependency's extra
    may drop them in any release. A top-level name several distributions share (the
    `opentelemetry` namespace) passes when one of them is declared."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        requirements += extra
    declared = {canonicalize_name(Requirement(r).name) for r in requirements}
    providers = importlib.metadata.packages_distributions()
    undeclared = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in third_party_imports(path):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names:
                continue
            distributions = providers.get(top, [])
            if not any(canonicalize_name(d) in declared for d in distributions):
                undeclared.append(f"{path.relative_to(PACKAGE).as_posix()}: {top} ({', '.join(distributions) or '?'})")
    assert undeclared == [], "imported but not declared in pyproject.toml:\n" + "\n".join(sorted(set(undeclared)))
