"""Admin operation on a model alias's price: input, output and cached-input per 1M tokens in
LANEWAY_CURRENCY, given as decimal figures ("2.50") and stored exactly as integer micro-units
(core/prices.py). Audited, applied to this replica's policy snapshot at once and announced to
the others by NOTIFY: requests prepared after the change cost the new price, those admitted
before keep the one they were admitted at."""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from laneway.admin.service import AdminService
from laneway.admin.validation import check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError
from laneway.core.prices import from_micros, to_micros
from laneway.db.models import Model
from laneway.db.repositories import AuditRepository, ModelRepository

Figure = str | float | int | None
FIELDS = ("input", "output", "cached_input")


class PriceIn(Struct, forbid_unknown_fields=True):
    """Per 1M tokens; input and output both null: the alias is not priced."""

    input: Figure = None
    output: Figure = None
    cached_input: Figure = None


def parse(data: PriceIn) -> tuple[int | None, int | None, int | None]:
    """The figures in micro-units; 400 naming the field for a bad one, or for one of input and
    output without the other."""
    out: list[int | None] = []
    for name in FIELDS:
        value = getattr(data, name)
        try:
            out.append(None if value is None else to_micros(value))
        except ValueError as exc:
            raise GatewayError(ErrorCode.INVALID_REQUEST, f"{name}: {exc}.", param=name) from None
    i, o, c = out
    if (i is None) != (o is None) or (i is None and c is not None):
        missing = "input" if i is None else "output"
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"A price needs both input and output ({missing} is missing); give neither to remove the price.",
            param=missing,
        )
    return i, o, c


def shown(svc: AdminService, alias: str, micros: tuple[int | None, int | None, int | None]) -> dict[str, Any]:
    figures = {name: from_micros(v) for name, v in zip(FIELDS, micros, strict=True)}
    return {"alias": alias, "currency": svc.currency, "per": "1M tokens", "priced": micros[0] is not None, **figures}


async def _model(session: Any, alias: str) -> Model:
    check_text("alias", alias, max_length=200)
    found = await ModelRepository(session).get(alias)
    if found is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"No model alias '{alias}'.", param="alias")
    return found


async def get_price(svc: AdminService, alias: str) -> dict[str, Any]:
    async with svc.sessions() as session:
        m = await _model(session, alias)
        return shown(svc, alias, (m.price_input, m.price_output, m.price_cached_input))


async def set_price(svc: AdminService, actor: str, alias: str, data: PriceIn) -> dict[str, Any]:
    """Give `alias` this price (input and output null: none)."""
    micros = parse(data)
    async with svc.sessions() as session, session.begin():
        m = await _model(session, alias)
        before = (m.price_input, m.price_output, m.price_cached_input)
        if before != micros:
            await ModelRepository(session).set_price(alias, micros)
            await AuditRepository(session).add(
                actor,
                "update",
                "model",
                alias,
                {"price": shown(svc, alias, before)},
                {"price": shown(svc, alias, micros)},
            )
    await svc.reload_policies()
    await svc.config_changes.notify()
    return shown(svc, alias, micros)
