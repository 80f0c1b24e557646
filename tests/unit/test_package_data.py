"""What laneway reads at run time lives inside the package (importlib.resources), so a wheel
has it; nothing is left in, or added back to, the old places in the source tree."""

from __future__ import annotations

from pathlib import Path

import laneway
from laneway import resources
from laneway.bootstrap import POLICIES_DIR
from laneway.db.migrate import MIGRATIONS_DIR

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(laneway.__file__).parent


def test_the_old_top_level_data_directories_are_gone() -> None:
    # A migration, template or policy added there (a merge from before the move) would be
    # ignored by the gateway: it reads only the package's copies.
    for old in ("migrations", "admin-ui", "policies"):
        left = [p for p in (ROOT / old).rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert not left, f"{old}/ moved into platform/laneway/; move these there: {left}"


def test_package_data_is_found_inside_the_package() -> None:
    assert MIGRATIONS_DIR == PACKAGE / "migrations" and (MIGRATIONS_DIR / "env.py").is_file()
    assert sorted(p.name for p in (MIGRATIONS_DIR / "versions").glob("0001_*.py"))
    templates = resources.package_dir(resources.ADMIN_TEMPLATES)
    assert templates == PACKAGE / "admin" / "templates" and (templates / "login.html").is_file()
    static = resources.package_dir(resources.ADMIN_STATIC)
    assert (static / "htmx.min.js").is_file() and (static / "admin.css").is_file()
    assert (POLICIES_DIR / "lanes.yaml").is_file() and (POLICIES_DIR / "tasks.yaml").is_file()
