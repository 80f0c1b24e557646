"""Replica scorers, one per file: each turns what dispatch knows of a candidate replica into a
number, with its own typed parameters; the picker adds them up (core/dispatch/picker.py)."""

from laneway.core.dispatch.scorers.candidate import Candidate
from laneway.core.dispatch.scorers.load import LoadScorer
from laneway.core.dispatch.scorers.prefix import PrefixScorer
from laneway.core.dispatch.scorers.session import SessionScorer

__all__ = ["Candidate", "LoadScorer", "PrefixScorer", "SessionScorer"]
