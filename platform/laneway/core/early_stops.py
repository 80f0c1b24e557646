"""Early stops: decoding ended by laneway when the answer is done, though the engine would go on.

- Repetition: a small model that loops ("the the the", one sentence over and over) decodes
  until max_tokens, holding its slot all the while. The rule fires when the last `ngram`
  units of the text have appeared `count` times in this answer.
- JSON: in the JSON modes, the answer is done when its top-level object or array closes,
  whatever the engine decodes after it (whitespace, or more text when nothing constrains it).
  It fires on the first text after the closing bracket (in the same delta or the next): an
  engine that ends right there (a grammar's end) is not cut, and claims no saving.
- JSON nesting: the same scanner keeps the key path (the keys, and `[]` for an array's
  items, under which each open object or array was opened). A small model may nest
  `{"a": {"b": {"a": {"b": ...` until max_tokens, a value that never closes; the repetition
  rule is off in the JSON modes (JSON repeats its keys by design), so the path is what shows
  the loop: it fires when the path ends with one run of up to NESTING_PERIOD keys repeated
  NESTING_REPEATS times, or the value nests deeper than MAX_JSON_DEPTH whatever its keys. A
  recursive value a client asked for (a tree's "children") repeats its path too, hence a
  count well past the depths such answers reach.

Both read the text as the client gets it (after the stop strings), incrementally: each piece
of text is scanned once, and the repetition rule does O(ngram) work per unit. Units are words
(runs of letters and digits) and single punctuation marks, whitespace left out: deltas carry
text, not token ids (a remote engine's chunk may hold several tokens), and the same text cut
into other deltas must stop at the same place, streamed or not.

A rule's `feed(text)` returns the offset in `text` to cut at (the end of the unit that made
the repetition, of the closing bracket, or of the opening bracket that nested too far), or
None while the answer goes on; its `reason` then names the rule that fired.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Protocol

from laneway.core.policy import TaskPolicy
from laneway.types import GenerationRequest

REPETITION = "repetition"
JSON_COMPLETE = "json_complete"
JSON_NESTING = "json_nesting"
JSON_MODES = ("json_object", "json_schema")
# The JSON nesting rule: a key path ending with a run of 1..NESTING_PERIOD keys repeated
# NESTING_REPEATS times ({"a": {"a": ... six deep; a tree's "children", [] six levels down),
# or any value nested deeper than MAX_JSON_DEPTH objects and arrays.
NESTING_PERIOD = 4
NESTING_REPEATS = 6
MAX_JSON_DEPTH = 32
KEY_CHARS = 64  # of a key, what the path keeps: a longer key is told apart by its start

_UNIT = re.compile(r"(\w+)|[^\w\s]")
_WORD_START = re.compile(r"\w+")
_JSON_SYNTAX = re.compile(r'[{}\[\]",]')
_IN_STRING = re.compile(r'["\\]')
ITEMS = "[]"  # the path's element for a value opened as an array's item


class EarlyStop(Protocol):
    reason: str

    def feed(self, text: str) -> int | None: ...


class RepetitionStop:
    """Fires when the n-gram of units ending now has been seen `count` times."""

    reason = REPETITION

    def __init__(self, ngram: int, count: int) -> None:
        self.ngram = ngram
        self.count = count
        self._window: deque[str] = deque(maxlen=ngram)
        self._seen: dict[tuple[str, ...], int] = {}
        self._word = ""  # a word at the end of the text so far: the next text may continue it

    def feed(self, text: str) -> int | None:
        pos = 0
        if self._word:
            more = _WORD_START.match(text)
            if more is not None:
                self._word += more.group()
                pos = more.end()
                if pos == len(text):
                    return None
            word, self._word = self._word, ""
            if self._add(word):
                return pos
        for m in _UNIT.finditer(text, pos):
            if m.lastindex and m.end() == len(text):  # a word at the very end: it may go on
                self._word = m.group()
                return None
            if self._add(m.group()):
                return m.end()
        return None

    def _add(self, unit: str) -> bool:
        window = self._window
        window.append(unit)
        if len(window) < self.ngram:
            return False
        key = tuple(window)
        seen = self._seen.get(key, 0) + 1
        self._seen[key] = seen
        return seen >= self.count


class JsonEnd:
    """Cuts where the top-level object or array closed (strings and escapes understood), once
    text follows it; or where the value nests without end (the key path repeating, or too
    deep). An answer that does not begin with an object or array (after whitespace) is left
    alone."""

    def __init__(self) -> None:
        self.reason = JSON_COMPLETE
        self._open: list[str] = []  # the brackets open, outermost first
        self._path: list[str] = []  # under which key (or ITEMS) each but the outermost was opened
        self._in_string = False
        self._escaped = False
        self._off = False
        self._complete = False  # the value closed at the end of the text so far
        self._expect_key = False  # in an object, before its next key
        self._key: str | None = None  # the key being read (None: the string is a value)
        self._last_key = ITEMS  # the innermost object's key whose value comes next

    def feed(self, text: str) -> int | None:
        if self._complete:
            return 0
        if self._off:
            return None
        i, end = 0, len(text)
        if not self._open:
            stripped = len(text) - len(text.lstrip())
            if stripped == end:
                return None
            if text[stripped] not in "{[":
                self._off = True
                return None
            i = stripped + 1
            self._push(text[stripped])
        while i < end:
            if self._in_string:
                i = self._read_string(text, i)
                continue
            m = _JSON_SYNTAX.search(text, i)
            if m is None:
                return None
            char, i = m.group(), m.end()
            if char == '"':
                self._in_string = True
                self._key = "" if self._expect_key and self._open[-1] == "{" else None
            elif char == ",":
                self._expect_key = self._open[-1] == "{"
            elif char in "{[":
                self._path.append(self._last_key if self._open[-1] == "{" else ITEMS)
                self._push(char)
                if self._nests_without_end():
                    self.reason = JSON_NESTING
                    return i
            else:
                self._open.pop()
                if not self._open:
                    if i < end:
                        return i
                    self._complete = True
                    return None
                self._path.pop()
        return None

    def _push(self, bracket: str) -> None:
        self._open.append(bracket)
        self._expect_key = bracket == "{"

    def _read_string(self, text: str, i: int) -> int:
        """Reads a string's text from i (to its closing quote, or the end of this text); where
        to go on. A key's text is kept for the path."""
        if self._escaped:
            self._escaped = False
            self._keep(text[i : i + 1])
            return i + 1
        m = _IN_STRING.search(text, i)
        if m is None:
            self._keep(text[i:])
            return len(text)
        if m.group() == "\\":
            self._escaped = True
            self._keep(text[i : m.end()])
        else:
            self._in_string = False
            self._keep(text[i : m.start()])
            if self._key is not None:
                self._last_key, self._key, self._expect_key = self._key, None, False
        return m.end()

    def _keep(self, piece: str) -> None:
        if self._key is not None and len(self._key) < KEY_CHARS:
            self._key = (self._key + piece)[:KEY_CHARS]

    def _nests_without_end(self) -> bool:
        """The path just grew: does it end with a run of keys repeated NESTING_REPEATS times,
        or is the value nested past MAX_JSON_DEPTH?"""
        path = self._path
        if len(self._open) > MAX_JSON_DEPTH:
            return True
        for period in range(1, NESTING_PERIOD + 1):
            span = period * NESTING_REPEATS
            if len(path) < span:
                return False
            if all(path[-k] == path[-k - period] for k in range(1, span - period + 1)):
                return True
        return False


@dataclass(frozen=True, slots=True)
class EarlyStopRule:
    """Which early stop a request's answers get; start() makes one choice's detector."""

    reason: str
    ngram: int = 0
    count: int = 0

    def start(self) -> EarlyStop:
        return JsonEnd() if self.reason == JSON_COMPLETE else RepetitionStop(self.ngram, self.count)


class AnswerStops:
    """One request's early stops: a detector per choice, and the choices they cut while the
    engine was still decoding them (what cancelling it saves)."""

    def __init__(self, rule: EarlyStopRule, n: int) -> None:
        self.reason = rule.reason  # the rule's, or after a cut the detector's (JSON: complete or nesting)
        self.stopped = False  # a choice was cut by it
        self._detectors = [rule.start() for _ in range(n)]
        self._pending = [False] * n  # cut, and the engine has not ended it itself since

    def cut(self, i: int, text: str) -> int | None:
        """Where to cut choice i's `text`, or None."""
        detector = self._detectors[i]
        at = detector.feed(text)
        if at is not None:
            self.stopped = self._pending[i] = True
            self.reason = detector.reason
        return at

    def engine_ended(self, i: int) -> None:
        """The engine finished choice i after it was cut (n > 1): nothing was saved on it."""
        self._pending[i] = False

    def saved(self, max_tokens: int, produced: list[int]) -> int:
        """Decode tokens not spent on the cut choices when the engine is cancelled now,
        estimated against max_tokens."""
        return sum(max(0, max_tokens - produced[i]) for i, cut in enumerate(self._pending) if cut)


def rule_for(policy: TaskPolicy | None, generation: GenerationRequest) -> EarlyStopRule | None:
    """The early stop of a request of this task, or None. None for a request that asked for a
    length (ignore_eos: a benchmark's exact lengths; min_tokens). In the JSON modes only the
    JSON rules apply (its end, its nesting): JSON repeats its keys by design, so the word
    repetition rule would cut values that are fine."""
    if policy is None:
        return None
    ext = generation.extensions
    if ext is not None and (ext.ignore_eos or ext.min_tokens):
        return None
    if (generation.response_format or {}).get("type") in JSON_MODES:
        return EarlyStopRule(JSON_COMPLETE) if policy.json_stop else None
    if policy.repetition_ngram:
        return EarlyStopRule(REPETITION, policy.repetition_ngram, policy.repetition_count)
    return None
