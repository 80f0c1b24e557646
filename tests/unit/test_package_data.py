"""What laneway reads at run time lives at the top of the repository (admin-ui/, migrations/,
policies/, as DESIGN.md lays out) and is read as package data through laneway.resources: in
the source tree through the links in platform/laneway/, in a wheel from the files the build
maps there (tests/integration/test_packaging.py builds and runs one)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import laneway
from laneway import resources
from laneway.admin.ui import ADMIN_UI_DIR
from laneway.bootstrap import POLICIES_DIR
from laneway.db.migrate import MIGRATIONS_DIR

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(laneway.__file__).parent

# The folder at the top, and the name the package (and the wheel) gives it.
TOP_LEVEL = {"admin-ui": "admin_ui", "migrations": "migrations", "policies": "policies"}


def test_the_data_lives_at_the_top_of_the_repository() -> None:
    assert (ROOT / "admin-ui" / "templates" / "login.html").is_file()
    assert (ROOT / "admin-ui" / "static" / "htmx.min.js").is_file()
    assert (ROOT / "migrations" / "env.py").is_file()
    assert sorted((ROOT / "migrations" / "versions").glob("0001_*.py"))
    assert (ROOT / "policies" / "lanes.yaml").is_file() and (ROOT / "policies" / "tasks.yaml").is_file()


def test_the_package_holds_links_to_the_top_level_folders_and_nothing_else() -> None:
    # A copy left in the package (a merge from before the move) would shadow nothing and be
    # read by nothing: the links are the only entries of those names.
    for top, name in TOP_LEVEL.items():
        link = PACKAGE / name
        assert link.is_symlink(), f"platform/laneway/{name} must be a link to {top}/, not a folder"
        assert os.readlink(link) == f"../../{top}", os.readlink(link)
        assert link.resolve() == ROOT / top
    for old in ("admin/templates", "admin/static"):
        assert not (PACKAGE / old).exists(), f"platform/laneway/{old} moved to admin-ui/"


def test_git_stores_the_links_as_links() -> None:
    # Mode 120000: a checkout makes a link (a clone with core.symlinks=false would get a text
    # file holding the target, and the editable install would find no data).
    if not (ROOT / ".git").exists():  # not a git checkout (an unpacked sdist): nothing to check
        return
    listed = subprocess.run(
        ["git", "ls-files", "--stage", *(f"platform/laneway/{name}" for name in TOP_LEVEL.values())],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert sorted(line.split()[0] for line in listed) == ["120000"] * len(TOP_LEVEL), listed


def test_every_lookup_resolves_to_the_top_level_folders() -> None:
    assert MIGRATIONS_DIR == ROOT / "migrations" and (MIGRATIONS_DIR / "env.py").is_file()
    templates = resources.package_dir(resources.ADMIN_TEMPLATES)
    assert templates == ROOT / "admin-ui" / "templates" and (templates / "login.html").is_file()
    static = resources.package_dir(resources.ADMIN_STATIC)
    assert static == ROOT / "admin-ui" / "static"
    assert (static / "htmx.min.js").is_file() and (static / "admin.css").is_file()
    assert ADMIN_UI_DIR == ROOT / "admin-ui"
    assert (POLICIES_DIR / "lanes.yaml").is_file() and (POLICIES_DIR / "tasks.yaml").is_file()
    assert Path(str(POLICIES_DIR)).resolve() == ROOT / "policies"
