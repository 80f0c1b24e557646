"""The package's layers (docs/architecture.md), enforced on every import the code makes: at the
top of a module, under TYPE_CHECKING or inside a function alike, since each of those still
ties the importer to the imported.

- Imports point down the layers only: L0 contracts ... L5 server and composition.
- Rooms on one floor that must not know each other (api and admin, api and portal, engines
  and db) don't; the portal builds on the admin, which never imports it.
- No import circle between modules.
- No module of the package is over 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "platform"
PACKAGE = ROOT / "laneway"
MAX_LINES = 400

# The first matching prefix names a module's layer (longest prefixes first where they nest).
LAYERS: list[tuple[str, int]] = [
    ("laneway.contracts", 0),
    ("laneway.types", 0),
    ("laneway.settings", 0),
    ("laneway.resources", 0),
    ("laneway.engines", 1),
    ("laneway.db", 1),
    ("laneway.migrations", 1),
    ("laneway.core", 2),
    ("laneway.metrics", 3),
    ("laneway.tracing", 3),
    ("laneway.usage", 3),
    ("laneway.api", 4),
    ("laneway.admin", 4),
    ("laneway.portal", 4),
    ("laneway.server", 5),
    ("laneway.runtime", 5),
    ("laneway.bootstrap", 5),
    ("laneway.app", 5),
    ("laneway.cli", 5),
    ("laneway.embedded", 5),
]
# Rooms on one floor that never import each other.
STRANGERS = [("laneway.api", "laneway.admin"), ("laneway.api", "laneway.portal"), ("laneway.engines", "laneway.db")]
# Rooms on one floor where the second builds on the first, never the other way: the customer
# portal uses the admin's sessions, password checks, throttle and key operations.
BUILDS_ON = [("laneway.admin", "laneway.portal")]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(name: str) -> int | None:
    if name == "laneway":
        return 0
    for prefix, floor in LAYERS:
        if name == prefix or name.startswith(prefix + "."):
            return floor
    return None


def in_room(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The laneway modules `path` imports, resolved to modules (a name imported from a package
    that is itself a submodule counts as that submodule)."""
    me = module_name(path)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names
            ]
        for target in targets:
            if target.startswith("laneway") and target != me:
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in known:
                    found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) for name, path in known.items()}


def test_every_module_has_a_layer() -> None:
    assert [name for name in modules() if layer(name) is None] == []


def test_imports_point_down_the_layers() -> None:
    upward = []
    for name, targets in graph().items():
        for target in targets:
            mine, theirs = layer(name), layer(target)
            assert mine is not None and theirs is not None
            if theirs > mine:
                upward.append(f"{name} (L{mine}) -> {target} (L{theirs})")
    assert upward == []


def test_rooms_on_one_floor_do_not_know_each_other() -> None:
    crossings = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        for a, b in STRANGERS
        if (in_room(name, a) and in_room(target, b)) or (in_room(name, b) and in_room(target, a))
    ]
    assert crossings == []


def test_a_room_never_imports_the_room_built_on_it() -> None:
    upward = [
        f"{name} -> {target}"
        for name, targets in graph().items()
        for target in targets
        for base, built in BUILDS_ON
        if in_room(name, base) and in_room(target, built)
    ]
    assert upward == []


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative: every group of modules that import each other in a ring."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    groups: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return groups


def test_no_import_circle() -> None:
    assert strongly_connected(graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_is_over_400_lines() -> None:
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
