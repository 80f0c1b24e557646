"""A Lua script the hub runs by its SHA1, with its source for loading it first."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib.resources import files


@dataclass(frozen=True, slots=True)
class LuaScript:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())  # Redis's script id

    @classmethod
    def packaged(cls, package: str, *names: str) -> LuaScript:
        """A script from `.lua` files shipped inside `package`, joined in order (a shared
        prelude first): read once, when the package's scripts module is imported."""
        root = files(package)
        return cls(names[-1], "".join(root.joinpath(f"{name}.lua").read_text("utf-8") for name in names))
