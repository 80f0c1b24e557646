"""Files laneway needs at run time, shipped inside the package (so a wheel runs from any
directory): Alembic's migrations, the admin UI's templates and static assets, the default
policies. Read through importlib.resources, never through a path into a source tree."""

from __future__ import annotations

import atexit
import contextlib
import functools
from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

MIGRATIONS = "migrations"
ADMIN_TEMPLATES = "admin/templates"
ADMIN_STATIC = "admin/static"
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
    package is on disk and as_file hands its path back; a zipped one is extracted once."""
    path = _held.enter_context(as_file(package_data(name)))
    if not path.is_dir():
        raise FileNotFoundError(f"laneway's package data {name!r} is missing (looked in {path}): a broken install")
    return path
