"""Replica scorers, one per file: each turns what dispatch knows of a candidate replica into a
number and registers itself by name (registry.py); the routing profile names the scorers the
picker adds up, with their weights (core/dispatch/picker.py).

Every module of this package is imported here, so a new scorer is one file (with its
`register_scorer` call) and nothing else to edit; a scorer defined elsewhere (a test, a plugin)
registers itself the same way before the gateway is built.
"""

import importlib
import pkgutil

from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.load import LoadScorer
from laneway.core.dispatch.scorers.prefix import PrefixScorer
from laneway.core.dispatch.scorers.registry import (
    DEFAULT_PROFILE,
    Profile,
    ProfiledScorer,
    build_scorers,
    parse_profile,
    register_scorer,
    scorer_names,
)
from laneway.core.dispatch.scorers.scorer import Scorer, ScorerFactory
from laneway.core.dispatch.scorers.session import SessionScorer
from laneway.core.dispatch.scorers.ttft import TtftScorer

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "DEFAULT_PROFILE",
    "Candidate",
    "LoadScorer",
    "PrefixScorer",
    "Profile",
    "ProfiledScorer",
    "Scorer",
    "ScorerFactory",
    "SessionScorer",
    "TtftScorer",
    "build_scorers",
    "parse_profile",
    "register_scorer",
    "scorer_names",
]
