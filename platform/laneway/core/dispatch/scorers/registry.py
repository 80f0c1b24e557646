"""The one scorer registry and the routing profile that picks from it.

Each scorer registers itself once, in its own file, by name: `register_scorer("prefix",
PrefixScorer)`. The routing profile (`LANEWAY_ROUTING_PROFILE`) names the scorers dispatch uses
and their weights, "prefix=1.0,session=0.5,load=0.5,ttft=1.0": a scorer the profile leaves out is not
used. The name is also the routing metric's `reason` when that scorer explains a placement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from laneway.core.dispatch.scorers.scorer import Scorer, ScorerFactory

Profile = tuple[tuple[str, float], ...]  # (scorer name, weight), in the profile's order

# Settings.routing_profile's default, parsed (tests/unit/test_scorer_registry.py keeps them equal).
# `ttft` decides where every candidate's latency model is warm; the others while one is cold.
DEFAULT_PROFILE: Profile = (("prefix", 1.0), ("session", 0.5), ("load", 0.5), ("ttft", 1.0))

_FACTORIES: dict[str, ScorerFactory] = {}


@dataclass(frozen=True, slots=True)
class ProfiledScorer:
    name: str  # as registered: the profile's word for it and the placement's reason
    scorer: Scorer


def register_scorer(name: str, factory: ScorerFactory) -> None:
    """Make `name` usable in a routing profile. Registering the same factory again is a no-op
    (a module imported twice); another factory under a taken name is a mistake."""
    if not name.isidentifier():
        raise ValueError(f"a scorer's name is a word usable in LANEWAY_ROUTING_PROFILE (got {name!r})")
    known = _FACTORIES.get(name)
    if known is not None and known is not factory:
        raise ValueError(f"a scorer named {name!r} is already registered")
    _FACTORIES[name] = factory


def scorer_names() -> list[str]:
    return sorted(_FACTORIES)


def parse_profile(text: str) -> Profile:
    """`name=weight` pairs separated by commas, strictly: an unknown scorer, a weight that is not
    a finite number >= 0, a name given twice or an empty profile is an error naming it."""
    where = "LANEWAY_ROUTING_PROFILE"
    pairs: list[tuple[str, float]] = []
    for item in text.split(","):
        name, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise ValueError(f"{where}: {item.strip()!r} is not name=weight (in {text!r})")
        if name not in _FACTORIES:
            raise ValueError(f"{where}: unknown scorer {name!r} (known: {', '.join(scorer_names())})")
        try:
            weight = float(raw)
        except ValueError:
            raise ValueError(f"{where}: scorer {name!r} has weight {raw!r}, not a number") from None
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(f"{where}: scorer {name!r} has weight {raw!r}: a finite number >= 0")
        if any(name == seen for seen, _ in pairs):
            raise ValueError(f"{where}: scorer {name!r} is named twice")
        pairs.append((name, weight))
    return tuple(pairs)


def build_scorers(profile: Profile) -> tuple[ProfiledScorer, ...]:
    """The profile's scorers, each built once from its weight, in the profile's order."""
    for name, _ in profile:
        if name not in _FACTORIES:
            raise ValueError(f"unknown scorer {name!r} (known: {', '.join(scorer_names())})")
    return tuple(ProfiledScorer(name, _FACTORIES[name](weight)) for name, weight in profile)
