"""Files laneway needs at run time: Alembic's migrations, the admin UI's templates and static
assets, the default policies. They live at the top of the repository (admin-ui/, migrations/,
policies/) and are read as laneway's package data through importlib.resources, the one lookup
path, whatever the install:

- a wheel carries them as laneway/admin_ui, laneway/migrations and laneway/policies (hatch
  force-includes the top-level folders there);
- the source tree (an editable install, or PYTHONPATH=platform) has links of those names in
  platform/laneway/ pointing at the top-level folders.

docs/decisions/0005-top-level-data.md says why links and not a second lookup."""

from __future__ import annotations

import atexit
import contextlib
import functools
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

MIGRATIONS = "migrations"
ADMIN_TEMPLATES = "admin_ui/templates"
ADMIN_STATIC = "admin_ui/static"
POLICIES = "policies"

# Directories handed out by package_dir() stay valid for the life of the process.
_held = contextlib.ExitStack()
atexit.register(_held.close)


def package_data(name: str) -> Traversable:
    """A file or directory of package data, to read (policies/*.yaml)."""
    return files("laneway").joinpath(*name.split("/"))


@functools.cache
def package_dir(name: str) -> Path:
    """A directory of package data as a filesystem path, for what only takes paths (Alembic's
    script_location, Jinja's loader, the static files router). An installed or editable
    package is on disk and as_file hands its path back; a zipped one is extracted once.

    The path is resolved: in the source tree it names the top-level folder, not the link."""
    path = _held.enter_context(as_file(package_data(name)))
    if not path.is_dir():
        raise FileNotFoundError(f"laneway's package data {name!r} is missing (looked in {path}): a broken install")
    return path.resolve()
