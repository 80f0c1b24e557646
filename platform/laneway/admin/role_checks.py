"""The checks an alias's roles pass before anything is written (admin/deployment_roles.py, and
admin/deployments.py for a whole alias): a weight or sample outside 0-100 or not a number, a
second shadow, a canary or shadow with no serving deployment beside it, canaries taking more
than 100 % together: 400 naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from msgspec import Struct

from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError


class Roled(Struct):
    """What check_roles reads of a deployment."""

    name: str
    role: str
    weight: float
    sample: float
    enabled: bool = True


def _refuse(message: str, param: str) -> GatewayError:
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def check_roles(rows: Sequence[Roled], param: Callable[[int, str], str]) -> None:
    """Refuse (400, `param(index, field)` named) an alias's roles that cannot work together."""
    for i, d in enumerate(rows):
        if d.role not in ("serving", "canary", "shadow"):
            raise _refuse(f"'{d.name}': role must be serving, canary or shadow (got {d.role!r}).", param(i, "role"))
        for field in ("weight", "sample"):
            value = getattr(d, field)
            if not isinstance(value, int | float) or not math.isfinite(value) or not 0 <= value <= 100:
                raise _refuse(f"'{d.name}': {field} must be a number of percent from 0 to 100.", param(i, field))
    enabled = [(i, d) for i, d in enumerate(rows) if d.enabled]
    serving = [d for _, d in enabled if d.role == "serving"]
    shadows = [i for i, d in enabled if d.role == "shadow"]
    if len(shadows) > 1:
        raise _refuse("An alias has at most one shadow deployment.", param(shadows[1], "role"))
    for i, d in enabled:
        if d.role != "serving" and not serving:
            raise _refuse(
                f"'{d.name}' cannot be a {d.role}: the alias has no serving deployment beside it to compare with.",
                param(i, "role"),
            )
    canaries = [(i, d) for i, d in enabled if d.role == "canary"]
    if sum(d.weight for _, d in canaries) > 100:
        raise _refuse("The canaries' weights add up to more than 100 %.", param(canaries[-1][0], "weight"))
