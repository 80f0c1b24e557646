"""laneway's tool-call envelope read as it is generated, so a generation cut short (max_tokens)
still answers with calls, never with the envelope as text.

The envelope is what engines/tool_calls.py asks for and its grammar forces: one call object
`{"name": ..., "arguments": {...}}`, or an array of them. EnvelopeReader is fed the text piece
by piece and keeps only positions (no re-parse per token). It tells:
- `closed`: the envelope is whole (its top-level value ended);
- `broken`: the text is not an envelope, nor the start of one, for these tools (auto mode:
  the model answered in JSON of its own, which stays text);
- `calls()`: every complete call, then the call in progress when its name is complete, with
  its arguments as far as they got (OpenAI's shape for a cut call: clients check
  finish_reason before they parse arguments).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from laneway.engines.tool_calls import new_call_id
from laneway.types import ToolCall

# The keys a call object may have: "parameters" is a name some models use for the arguments.
NAME_KEY = "name"
ARGUMENT_KEYS = ("arguments", "parameters")
CALL_KEYS = (NAME_KEY, *ARGUMENT_KEYS)
WHITESPACE = " \t\n\r"


@dataclass
class _CallSpan:
    """One call object's positions in the text."""

    start: int
    end: int | None = None  # past its closing brace, once closed
    key: str | None = None  # the key whose value comes (or is being read) next
    name: str | None = None  # once its string is complete
    args_start: int | None = None
    args_end: int | None = None  # past the arguments' value, once it ended


@dataclass
class _String:
    start: int
    role: str  # "key", "name", or "value" (inside the arguments or another value)
    escaped: bool = False


@dataclass
class EnvelopeReader:
    """Reads the envelope as it comes (see the module's doc)."""

    names: frozenset[str]
    text: str = ""
    closed: bool = False
    broken: bool = False
    _depth: int = 0
    _call_depth: int = 0  # the depth inside a call object: 1 (one object) or 2 (an array of them)
    _expect: str = "value"  # inside a call object: "key", "colon", "value", "in_value" or "comma"
    _string: _String | None = None
    _scalar: bool = False  # a number or literal value is being read at the call's level
    _calls: list[_CallSpan] = field(default_factory=list)

    @classmethod
    def of(cls, tools: Sequence[dict[str, Any]]) -> EnvelopeReader:
        return cls(frozenset(str((t.get("function") or {}).get("name")) for t in tools))

    @property
    def complete_calls(self) -> int:
        return sum(1 for c in self._calls if c.end is not None)

    def feed(self, piece: str) -> None:
        start = len(self.text)
        self.text += piece
        for i in range(start, len(self.text)):
            if self.broken or self.closed:
                return  # what follows a whole envelope is dropped (the grammar allows a space)
            self._char(self.text[i], i)

    # -- the scanner --
    def _char(self, c: str, i: int) -> None:
        s = self._string
        if s is not None:
            if s.escaped:
                s.escaped = False
            elif c == "\\":
                s.escaped = True
            elif c == '"':
                self._string = None
                self._string_ended(s, i)
            return
        if c in WHITESPACE:
            self._scalar_ended(i)
            return
        if self._depth == 0:
            self._open_top(c, i)
        elif c in "{[":
            self._open(c, i)
        elif c in "}]":
            self._close(c, i)
        elif self._depth < self._call_depth:  # between an array's calls: only commas
            self.broken = c != ","
        elif c == '"':
            self._open_string(i)
        elif self._depth == self._call_depth:
            self._call_level(c, i)

    def _open_top(self, c: str, i: int) -> None:
        if c not in "{[":
            self.broken = True
            return
        self._depth, self._call_depth = 1, 1 if c == "{" else 2
        if c == "{":
            self._begin_call(i)

    def _begin_call(self, i: int) -> None:
        self._calls.append(_CallSpan(i))
        self._expect = "key"

    def _open(self, c: str, i: int) -> None:
        if self._depth == self._call_depth - 1:  # an item of the array: a call object
            if c != "{":
                self.broken = True
                return
            self._begin_call(i)
        elif self._depth == self._call_depth:
            self._value_starts(i)
            if self.broken:
                return
        self._depth += 1

    def _close(self, c: str, i: int) -> None:
        self._scalar_ended(i)
        self._depth -= 1
        if self._depth == self._call_depth - 1:  # a call object ends
            if c != "}" or self._expect not in ("comma", "key"):
                self.broken = True
                return
            self._end_call(i + 1)
        elif self._depth < self._call_depth - 1 and c != "]":  # only an array closes here
            self.broken = True
            return
        elif self._depth == self._call_depth:  # a value at the call's level ends
            self._value_ended(i + 1)
        if self._depth == 0 and not self.broken:
            self.closed = True

    def _open_string(self, i: int) -> None:
        if self._depth == self._call_depth:
            if self._expect == "key":
                self._string = _String(i, "key")
                return
            call = self._calls[-1]
            self._value_starts(i)
            self._string = _String(i, "name" if call.key == NAME_KEY else "value")
            return
        self._string = _String(i, "value")

    def _string_ended(self, s: _String, i: int) -> None:
        if self._depth != self._call_depth:
            return
        call = self._calls[-1]
        if s.role == "value":
            self._value_ended(i + 1)
            return
        try:  # without a grammar (auto mode) a string may hold what JSON does not allow
            value = json.loads(self.text[s.start : i + 1])
        except ValueError:
            self.broken = True
            return
        if s.role == "key":
            key = value
            if key not in CALL_KEYS:
                self.broken = True
            call.key, self._expect = key, "colon"
        else:
            if value not in self.names:
                self.broken = True
            call.name = value
            self._value_ended(i + 1)

    def _call_level(self, c: str, i: int) -> None:
        """A character at the call object's level outside strings and nested values."""
        if c == ":" and self._expect == "colon":
            self._expect = "value"
        elif c == ",":
            self._scalar_ended(i)
            if self._expect != "comma":
                self.broken = True
            self._expect = "key"
        elif self._expect == "value" or self._scalar:
            if not self._scalar:
                self._value_starts(i)
                self._scalar = True
        else:
            self.broken = True

    def _value_starts(self, i: int) -> None:
        call = self._calls[-1]
        if self._expect != "value":
            self.broken = True
            return
        if call.key in ARGUMENT_KEYS:
            call.args_start = i
        self._expect = "in_value"

    def _value_ended(self, end: int) -> None:
        call = self._calls[-1]
        if call.key in ARGUMENT_KEYS and call.args_start is not None and call.args_end is None:
            call.args_end = end
        self._expect = "comma"

    def _scalar_ended(self, i: int) -> None:
        if self._scalar:
            self._scalar = False
            self._value_ended(i)

    def _end_call(self, end: int) -> None:
        call = self._calls[-1]
        call.end = end
        try:
            value = json.loads(self.text[call.start : end])
        except ValueError:
            self.broken = True
            return
        arguments = _arguments_of(value)
        if value.get(NAME_KEY) not in self.names or not isinstance(arguments, dict):
            self.broken = True

    # -- the answer --
    def started_well(self) -> bool:
        """Whether the text so far could still become an envelope: not broken, and a key or
        name being written is the start of one that may come."""
        if self.broken or self._depth == 0:
            return False
        s = self._string
        if s is None or self._depth != self._call_depth or s.role == "value":
            return True
        so_far = self.text[s.start + 1 :]
        allowed = CALL_KEYS if s.role == "key" else tuple(self.names)
        return any(option.startswith(so_far) for option in allowed)

    def calls(self, *, partial: bool = True) -> tuple[ToolCall, ...]:
        """The complete calls, then (partial=True) the one in progress whose name is complete."""
        out: list[ToolCall] = []
        for call in self._calls:
            if call.end is not None:
                value = json.loads(self.text[call.start : call.end])
                arguments = json.dumps(_arguments_of(value), ensure_ascii=False)
                out.append(ToolCall(id=new_call_id(), name=str(value[NAME_KEY]), arguments=arguments, index=len(out)))
            elif partial and call.name is not None:
                out.append(
                    ToolCall(id=new_call_id(), name=call.name, arguments=self._partial_arguments(call), index=len(out))
                )
        return tuple(out)

    def _partial_arguments(self, call: _CallSpan) -> str:
        if call.args_start is None:
            return ""
        raw = self.text[call.args_start : call.args_end]
        if call.args_end is not None:  # whole, though the object around it is not
            try:
                return json.dumps(json.loads(raw), ensure_ascii=False)
            except ValueError:  # auto mode: no grammar kept it JSON
                return raw
        return raw


def _arguments_of(value: dict[str, Any]) -> Any:
    return value.get(ARGUMENT_KEYS[0], value.get(ARGUMENT_KEYS[1], {}))


def cut_calls(text: str, tools: Sequence[dict[str, Any]]) -> tuple[ToolCall, ...] | None:
    """The calls in an answer cut short: None when it is not an envelope (plain text, or JSON
    of the model's own), else the complete calls and the one in progress (maybe none)."""
    reader = EnvelopeReader.of(tools)
    reader.feed(text)
    if reader.closed:
        return reader.calls()
    return reader.calls() if reader.started_well() else None
