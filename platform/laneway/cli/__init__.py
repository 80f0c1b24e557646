"""The `laneway` command: serve, migrate, make-demo-model, fetch-model, import-policies, tenants, keys, models."""

from __future__ import annotations

import logging

from laneway.cli.parser import build_parser
from laneway.cli.serving import preflight
from laneway.settings import Settings

__all__ = ["build_parser", "main", "preflight"]


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if getattr(args, "changes", None) is not None and not args.changes(args):  # a `set` that names nothing
        args.usage.error("name at least one thing to change (see --help)")
    settings = Settings.from_env()
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("alembic", "gguf"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args.fn(settings, args)
