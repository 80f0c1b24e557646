"""The admin page of one model alias: its replicas with their live state, and what an admin
does to them: add one through the typed form of its engine kind (admin/engine_forms.py, never
a JSON box), drain or resume, disable or enable, remove, or swap its engine. Every change goes
through the admin service (admin/deployments.py, admin/replicas.py): the API's checks, the
engine started and warmed before it takes requests, an audit row, NOTIFY. A refused change
is shown beside the field it concerns, in the engine's own words, and changes nothing.

The alias travels as a query or form value, not in the path: an alias may hold a "/"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from litestar import Controller, get, post
from litestar.di import NamedDependency, Provide
from litestar.params import FromPath, SkipValidation
from litestar.response import Redirect, Template

from laneway.admin import deployments, replicas
from laneway.admin.dependencies import Queues, QueueStats, Registry, Routing, RoutingFigures
from laneway.admin.deployments import DeploymentIn
from laneway.admin.engine_forms import (
    PREFIX,
    SECRETS,
    config_fields,
    form_values,
    kind_description,
    kinds,
    read_config,
)
from laneway.admin.forms import form_lists, form_of
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.replica_view import alias_waiting, replica_rows, where_it_runs
from laneway.admin.service import AdminService
from laneway.admin.ui import Page, to_login
from laneway.admin.validation import check_text, convert
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import PolicyRepository
from laneway.engines.config import EngineConfigError
from laneway.engines.registry import EngineRegistry

DEPLOYMENT_FIELDS = ("name", "max_model_len", "quantization", "gpu_type")


def alias_url(alias: str, **query: str) -> str:
    extra = "".join(f"&{k}={quote(v, safe='')}" for k, v in query.items() if v)
    return f"/admin/models/alias?name={quote(alias, safe='')}{extra}"


@dataclass(frozen=True)
class AliasView:
    """What the alias page reads, handed to each of its routes as one dependency."""

    svc: AdminService
    registry: EngineRegistry
    figures: RoutingFigures
    queues: QueueStats


def alias_view(
    admin_service: NamedDependency[AdminService], registry: Registry, routing_figures: Routing, queue_stats: Queues
) -> AliasView:
    return AliasView(admin_service, registry, routing_figures, queue_stats)


class ReplicaPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin/models"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}
    dependencies = {"view": Provide(alias_view, sync_to_thread=False)}

    async def _page(
        self,
        request: AdminRequest,
        view: AliasView,
        alias: str,
        *,
        kind: str = "",
        swap: str = "",
        status: int | None = None,
        **extra: Any,
    ) -> Template:
        svc, registry, figures, queues = view.svc, view.registry, view.figures, view.queues
        rows = await deployments.replicas(svc, alias)
        async with svc.sessions() as session:
            lanes = [lane.name for lane in await PolicyRepository(session).lanes()]
        swapping = next((d for d in rows if d.name == swap), None)
        kind = kind if kind in kinds() else (swapping or (rows[0] if rows else None) or _VLLM).engine_kind
        fields = config_fields(kind, lanes)
        sent = extra.pop("typed", None)  # a refused form, as it was typed
        same = swapping is not None and swapping.engine_kind == kind  # a swap of the same kind: an edit
        if sent is not None:
            values = {**sent, **{f.name: sent.get(f.name, "false") for f in fields if f.help.kind == "checkbox"}}
            checked = list(sent.get(PREFIX + "lanes", []))
        else:
            values = form_values(kind, swapping.config) if swapping is not None and same else {}
            for f in fields:  # a checkbox shows its default
                if f.help.kind == "checkbox":
                    values.setdefault(f.name, "true" if f.default else "false")
            if swapping is not None and same:
                values |= {f: str(getattr(swapping, f)) for f in DEPLOYMENT_FIELDS[1:]}
            checked = list(swapping.config.get("lanes") or []) if swapping is not None and same else []
        context = {
            "admin": request.user.username,
            "csrf": request.user.csrf,
            "alias": alias,
            "kinds": kinds(),
            "kind": kind,
            "kind_description": kind_description(kind),
            "fields": fields,
            "values": values,
            "checked": checked,
            "swap": swapping,
            "replicas": replica_rows(rows, registry, figures, queues) if rows else [],
            "waiting": alias_waiting(alias, queues),
            "errors": {},
            "alias_url": alias_url(alias),
            "advanced_open": any(f.advanced and f.name in extra.get("errors", {}) for f in fields),
            **extra,
        }
        code = status or (400 if extra.get("errors") or extra.get("error") else 200)
        # After a form's POST the address bar shows the alias page (htmx), so a reload reads it again.
        headers = {"HX-Replace-Url": alias_url(alias)} if request.method == "POST" else {}
        return Template("model.html", context=context, status_code=code, headers=headers)

    @get("/alias")
    async def alias_page(
        self,
        request: AdminRequest,
        view: SkipValidation[AliasView],
    ) -> Page:
        """?name= the alias (a new one: the form for its first replica); ?kind= the engine kind
        of the add form; ?swap= a replica to serve by another engine."""
        params = request.query_params
        alias = params.get("name", "").strip()
        try:
            check_text("alias", alias, max_length=200)
        except GatewayError:
            return Redirect("/admin/models", status_code=303)
        return await self._page(
            request,
            view,
            alias,
            kind=params.get("kind", ""),
            swap=params.get("swap", ""),
        )

    @get("/replicas/panel")
    async def panel(
        self,
        request: AdminRequest,
        view: SkipValidation[AliasView],
    ) -> Page:
        """The replicas table alone, for the page's htmx refresh."""
        alias = request.query_params.get("name", "")
        rows = await deployments.replicas(view.svc, alias)
        context = {
            "alias": alias,
            "csrf": request.user.csrf,
            "waiting": alias_waiting(alias, view.queues),
            "replicas": replica_rows(rows, view.registry, view.figures, view.queues),
            "alias_url": alias_url(alias),
        }
        return Template("model_replicas.html", context=context)

    @post("/replicas/add")
    async def add(
        self,
        request: AdminRequest,
        view: SkipValidation[AliasView],
    ) -> Page:
        return await self._typed(request, view, swap="")

    @post("/replicas/swap")
    async def swap(
        self,
        request: AdminRequest,
        view: SkipValidation[AliasView],
    ) -> Page:
        form = await form_of(request)
        return await self._typed(request, view, swap=form.get("name", ""))

    async def _typed(
        self,
        request: AdminRequest,
        view: AliasView,
        *,
        swap: str,
    ) -> Page:
        """Add a replica, or swap one's engine, from the typed form; a refusal beside its field."""
        svc = view.svc
        form = await form_of(request)
        checked = await form_lists(request, PREFIX + "lanes")
        alias, kind, actor = form.get("alias", "").strip(), form.get("kind", ""), request.user.username
        errors: dict[str, str] = {}
        try:
            config = read_config(kind, form, checked) if kind in kinds() else {}
            if swap:  # a secret is never shown back: left blank, the replica keeps its own
                old = next((d for d in await deployments.replicas(svc, alias) if d.name == swap), None)
                if old is not None and old.engine_kind == kind:
                    config |= {k: v for k, v in old.config.items() if k in SECRETS and k not in config}
            raw = {
                "name": form.get("name", "").strip(),
                "engine_kind": kind,
                "config": config,
                **{f: form[f].strip() for f in DEPLOYMENT_FIELDS[1:] if form.get(f, "").strip()},
            }
            replica = convert(raw, DeploymentIn, strict=False)
            if swap:
                await replicas.swap_replica(svc, actor, alias, swap, replica)
            else:
                await deployments.add_replica(svc, actor, alias, replica)
        except EngineConfigError as exc:  # the engine's own words, beside its key
            errors[PREFIX + exc.key if exc.key else "form"] = str(exc)
        except GatewayError as exc:
            errors[_field_of(exc.param, kind)] = exc.message
        if errors:
            typed = {**form, PREFIX + "lanes": checked.get(PREFIX + "lanes", [])}
            return await self._page(
                request,
                view,
                alias,
                kind=kind,
                swap=swap,
                errors=errors,
                typed=typed,
                status=400,
            )
        done = f"Swapped {swap} to {kind}: it took over once warm." if swap else f"Added {form.get('name')} ({kind})."
        return await self._page(request, view, alias, notice=done)

    @post("/replicas/{action:str}")
    async def act(
        self,
        request: AdminRequest,
        action: FromPath[str],
        view: SkipValidation[AliasView],
    ) -> Page:
        """drain / resume / disable / enable / remove one replica (form: alias, name)."""
        form = await form_of(request)
        alias, name, actor = form.get("alias", "").strip(), form.get("name", ""), request.user.username
        svc = view.svc
        done = {
            "drain": f"Draining {name}: it takes no new request; what it runs finishes.",
            "resume": f"{name} takes requests again.",
            "disable": f"Disabled {name}: its engine stops once idle.",
            "enable": f"Enabled {name}: started and warm.",
            "remove": f"Removed {name}.",
        }
        try:
            if action in ("drain", "resume"):
                await replicas.set_draining(svc, actor, alias, name, action == "drain")
            elif action in ("disable", "enable"):
                await replicas.set_enabled(svc, actor, alias, name, action == "enable")
            elif action == "remove":
                await deployments.remove_replica(svc, actor, alias, name)
            else:
                return Redirect(alias_url(alias), status_code=303)
        except GatewayError as exc:  # shown on the replica's row; nothing changed
            return await self._page(
                request,
                view,
                alias,
                row_errors={name: exc.message},
                status=exc.status,
            )
        return await self._page(request, view, alias, notice=done[action])


class _VLLM:
    engine_kind = "vllm"  # the add form's kind for an alias with no replica yet


def _field_of(param: str | None, kind: str) -> str:
    """The input a refusal concerns: deployments[i].name -> name; a start failure
    (deployments[i]) -> where the engine runs (base_url, url, model_path)."""
    field = (param or "").rsplit(".", 1)[-1] if param and "." in param else (param or "")
    if field.startswith("deployments[") or field == "":
        where = where_it_runs(kind)
        return PREFIX + where if where else "form"
    return field if field in DEPLOYMENT_FIELDS else "form"
