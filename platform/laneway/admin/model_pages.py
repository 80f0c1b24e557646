"""The admin Models page: every deployment and its state (starting, warm, failed, draining),
the way to a new alias (its first replica is added on the alias page, admin/replica_pages.py,
through its engine's typed form), each alias's fallbacks (an ordered, comma-separated list
of aliases) and its price per 1M tokens (admin/prices.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import SkipValidation
from litestar.response import Template

from laneway.admin import fallbacks, prices
from laneway.admin.dependencies import Latency, LatencyFigures, Registry, Routing, RoutingFigures
from laneway.admin.fallbacks import FallbacksIn, split_aliases
from laneway.admin.forms import form_of
from laneway.admin.guards import AdminRequest, AdminSession, NotLoggedIn
from laneway.admin.presentation import latency_shown, replica_state
from laneway.admin.service import AdminService
from laneway.admin.ui import Page, to_login
from laneway.admin.validation import convert
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import ModelRepository
from laneway.engines.kinds import engine_kind_names
from laneway.engines.registry import EngineRegistry, LiveDeployment


@dataclass(frozen=True)
class ModelsView:
    """What the Models page reads, handed to each of its routes as one dependency."""

    svc: AdminService
    registry: EngineRegistry
    figures: RoutingFigures
    latency: LatencyFigures


def models_view(
    admin_service: NamedDependency[AdminService], registry: Registry, routing_figures: Routing, latency_figures: Latency
) -> ModelsView:
    return ModelsView(admin_service, registry, routing_figures, latency_figures)


class ModelPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}
    dependencies = {"view": Provide(models_view, sync_to_thread=False)}

    async def _models_page(
        self, view: ModelsView, current: AdminSession, status: int | None = None, **extra: Any
    ) -> Template:
        svc, registry, figures, latency = view.svc, view.registry, view.figures, view.latency
        async with svc.sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
            graph = await ModelRepository(session).fallback_graph()
            priced = await ModelRepository(session).prices()
        live = {d.spec.name: d for d in registry.deployments()}
        figures_now, learned = figures(), latency()
        deployments = [
            {
                "alias": s.alias,
                "name": s.name,
                "engine": s.engine_kind,
                "quantization": s.quantization,
                "gpu_type": s.gpu_type,
                "max_model_len": s.max_model_len,
                "draining": s.draining,
                "state": "failed" if s.name in registry.failed else "warm" if s.name in registry.warm else "starting",
                **replica_state(live.get(s.name), figures_now.get(s.name)),
                **latency_shown(learned.get(s.name), _slots(live.get(s.name))),
            }
            for s in specs
        ]
        capped: dict[str, list[str]] = {}
        sequences: dict[str, int] = {}
        for cap in svc.lane_caps():  # a lane below the engine's own sequence limit queues while it has room
            capped.setdefault(cap.deployment, []).append(f"{cap.lane} {cap.cap}")
            sequences[cap.deployment] = cap.sequences
        extra = {"lane_caps": capped, "sequences": sequences, **extra}
        context = {
            "admin": current.username,
            "csrf": current.csrf,
            "deployments": deployments,
            "engine_kinds": engine_kind_names(),
            "fallbacks": graph,
            "currency": svc.currency,
            "prices": {a: prices.shown(svc, a, p) for a, p in priced.items()},
            **extra,
        }
        return Template("models.html", context=context, status_code=status or (400 if extra.get("error") else 200))

    async def _refused(self, view: ModelsView, current: AdminSession, exc: GatewayError, **typed: Any) -> Template:
        """The page again with the refusal and what was typed; nothing was changed."""
        return await self._models_page(view, current, error=exc.message, status=exc.status, **typed)

    @get("/models")
    async def models(
        self,
        request: AdminRequest,
        view: SkipValidation[ModelsView],
    ) -> Page:
        return await self._models_page(view, request.user)

    @post("/models/fallbacks")
    async def save_fallbacks(
        self,
        request: AdminRequest,
        view: SkipValidation[ModelsView],
    ) -> Page:
        current, form = request.user, await form_of(request)
        alias = form.get("alias", "").strip()
        try:
            data = convert({"fallbacks": split_aliases(form.get("fallbacks", ""))}, FallbacksIn)
            result = await fallbacks.set_fallbacks(view.svc, current.username, alias, data)
        except GatewayError as exc:  # shown on the page; nothing was changed
            return await self._refused(
                view,
                current,
                exc,
                typed_alias=alias,
                typed_fallbacks=form.get("fallbacks", ""),
            )
        listed = ", ".join(result["fallbacks"]) or "none"
        return await self._models_page(
            view,
            current,
            notice=f"{alias} falls back to {listed}.",
        )

    @post("/models/price")
    async def save_price(
        self,
        request: AdminRequest,
        view: SkipValidation[ModelsView],
    ) -> Page:
        """Empty input and output: the alias is no longer priced."""
        current, form = request.user, await form_of(request)
        alias = form.get("alias", "").strip()
        typed = {name: form.get(f"price_{name}", "").strip() for name in prices.FIELDS}
        try:
            data = convert({k: v or None for k, v in typed.items()}, prices.PriceIn)
            result = await prices.set_price(view.svc, current.username, alias, data)
        except GatewayError as exc:  # shown on the page; nothing was changed
            return await self._refused(
                view,
                current,
                exc,
                typed_price_alias=alias,
                typed_price=typed,
            )
        said = (
            f"{alias} costs {result['input']} in, {result['output']} out per 1M tokens ({result['currency']})."
            if result["priced"]
            else f"{alias} has no price."
        )
        return await self._models_page(view, current, notice=said)


def _slots(live: LiveDeployment | None) -> int:
    return 1 if live is None else live.engine.info.max_concurrency
