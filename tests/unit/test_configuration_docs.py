"""The docs agree with the code: docs/configuration.md is what settings.py generates, every
relative link in the README and docs/ points at a file that exists, every module they (and
pyproject.toml's comments) name by its `.py` path exists, and no box of a diagram repeats the
row above it."""

import dataclasses
import importlib.util
import itertools
import os
import re
from pathlib import Path
from types import ModuleType

from laneway.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
REGENERATE = "PYTHONPATH=platform .venv/bin/python scripts/config_docs.py"

# Pages written in parallel by other parts of the same change; they may be absent from a branch
# that has not merged them yet (the decision records 0001-0005, the engines' launch recipes that
# move from engines/README.md). Every other link must resolve.
ELSEWHERE = re.compile(r"docs/decisions/000[1-5]-[^/]+\.md|docs/engines/README\.md")

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def config_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_docs", ROOT / "scripts" / "config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_configuration_page_is_generated_from_settings() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_docs().render(), f"docs/configuration.md is stale: run {REGENERATE}"


def test_every_setting_has_a_row_with_its_help() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `LANEWAY_")}
    names = [f"LANEWAY_{field.name.upper()}" for field in dataclasses.fields(Settings)]
    assert sorted(rows) == sorted(names)
    for name, row in rows.items():
        assert row.rstrip(" |").rsplit("|", 1)[-1].strip(), f"{name} has no description"


def markdown_files() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "bench" / "README.md"]
    pages += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "bench" / "results").glob("*.md"))
    return [page for page in pages if page.exists()]


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub makes: lower case, punctuation dropped, spaces to hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+\s+(.+?)\s*$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_relative_links_resolve() -> None:
    broken = []
    for page in markdown_files():
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
            if not path.exists():
                if not ELSEWHERE.fullmatch(relative):
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links to files or headings that do not exist:\n" + "\n".join(broken)


def test_the_links_are_checked_at_all() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(LINK.findall(readme)) >= 10


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail to docs/ or bench/results/"


# A module named by its path (`core/early_stops.py`, `bench/streaming.py`) or its file name alone.
MODULE_PATH = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.py)\b")


def repository_file_names() -> set[str]:
    names = set()
    for _, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "node_modules"]
        names.update(f for f in files if f.endswith(".py"))
    return names


def test_module_paths_named_in_the_docs_exist() -> None:
    """A module renamed or split leaves its old path in the prose (issue 37: pyproject's
    comments named `core/redis_batch.py` and `engines/http1.py`, traffic-control.md
    `core/quota_recovery.py`). A path is looked for from the repository's root, the package's
    (`core/...` means platform/laneway/core/...) and the page's own folder; a bare file name
    anywhere in the repository. The dated runs in bench/results/ are records of their day."""
    pages = [page for page in markdown_files() if "results" not in page.relative_to(ROOT).parts]
    names = repository_file_names()
    missing = []
    for page in [*pages, ROOT / "pyproject.toml"]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for path in MODULE_PATH.findall(line):
                bases = (ROOT, ROOT / "platform" / "laneway", ROOT / "platform", page.parent)
                found = any((base / path).is_file() for base in bases) if "/" in path else path in names
                if not found:
                    missing.append(f"{page.relative_to(ROOT)}:{number}: {path}")
    assert not missing, "modules named in the docs that do not exist:\n" + "\n".join(missing)


def diagram_cells(line: str) -> list[tuple[int, str]]:
    return [(m.start(), m.group()) for m in re.finditer(r"[^|]+", line)] if line.count("|") >= 2 else []


def test_no_diagram_box_repeats_the_row_above() -> None:
    """A box's text on two lines running (architecture.md's first diagram had its engines'
    '(gRPC), sim' twice): a row pasted twice, not a fact."""
    repeated = []
    for page in markdown_files():
        for block in FENCE.findall(page.read_text(encoding="utf-8")):
            if not re.search(r"^\s*\+-", block, re.M):
                continue  # no box drawn: a table of figures repeats its values by right
            lines = block.splitlines()
            for above, below in itertools.pairwise(lines):
                top, bottom = diagram_cells(above), diagram_cells(below)
                if not top or [at for at, _ in top] != [at for at, _ in bottom]:
                    continue  # not two rows of one table of boxes
                for (_, a), (_, b) in zip(top, bottom, strict=True):
                    if a == b and re.search(r"[A-Za-z]", a):
                        repeated.append(f"{page.relative_to(ROOT)}: {a.strip()!r}")
    assert not repeated, "diagram rows repeated:\n" + "\n".join(repeated)
