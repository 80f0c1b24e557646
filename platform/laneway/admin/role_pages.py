"""The alias page's engine-swap panel: each replica's role (serving, canary with its weight,
shadow with its sample rate) with a form to change it, the promote and rollback actions, and
the Compare view (the candidate's figures beside the serving pool's, with the request count
each rests on, and the shadow's worst disagreements to read). Every change goes through
admin/deployment_roles.py: the same checks as the API and the CLI, audited, live at once. The panel is
loaded into the alias page by htmx; a refused change is shown in it and changes nothing."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, post
from litestar.params import FromPath
from litestar.response import Template

from laneway.admin import deployment_roles, deployments
from laneway.admin.dependencies import Service, Swaps
from laneway.admin.forms import form_of
from laneway.admin.guards import AdminRequest, NotLoggedIn
from laneway.admin.service import AdminService
from laneway.admin.ui import to_login
from laneway.admin.validation import convert
from laneway.contracts.errors import GatewayError

ACTIONS = ("set", "promote", "rollback")


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def _column(figures: dict[str, Any]) -> dict[str, str]:
    """One pool's figures as the Compare view shows them."""
    errors = ", ".join(f"{code} {n}" for code, n in sorted(figures["errors"].items())) or "none"
    tokens, cost = figures["completion_tokens_per_request"], figures["cost_micros_per_request"]
    return {
        "requests": str(figures["requests"]),
        "error_rate": _percent(figures["error_rate"]),
        "errors": errors,
        "ttft_p50": _ms(figures["ttft_p50_s"]),
        "ttft_p99": _ms(figures["ttft_p99_s"]),
        "ttft_samples": str(figures["ttft_samples"]),
        "tokens": "-" if tokens is None else f"{tokens:.1f}",
        "cost": "-" if cost is None else f"{cost / 1e6:.6f}",
    }


class RolePages(Controller):
    path = "/admin/models/roles"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _panel(
        self, request: AdminRequest, svc: AdminService, alias: str, *, status: int = 200, **extra: Any
    ) -> Template:
        rows = await deployments.replicas(svc, alias)
        context = {"alias": alias, "csrf": request.user.csrf, "rows": rows, **extra}
        return Template("model_roles.html", context=context, status_code=status)

    @get("/panel")
    async def panel(self, request: AdminRequest, admin_service: Service) -> Template:
        return await self._panel(request, admin_service, request.query_params.get("name", ""))

    @post("/{action:str}")
    async def act(self, request: AdminRequest, admin_service: Service, action: FromPath[str]) -> Template:
        """set (form: alias, name, role, weight, sample in percent) / promote / rollback (alias, name)."""
        form = await form_of(request)
        alias, name, actor = form.get("alias", ""), form.get("name", ""), request.user.username
        if action not in ACTIONS:
            return await self._panel(request, admin_service, alias, status=404, row_errors={name: "No such action."})
        try:
            if action == "set":
                raw = {k: form[k] for k in ("role", "weight", "sample") if form.get(k, "").strip()}
                data = convert(raw, deployment_roles.RoleIn, strict=False)
                done = await deployment_roles.set_role(admin_service, actor, alias, name, data)
                notice = f"{name} is now {done['role']}."
            elif action == "promote":
                await deployment_roles.promote(admin_service, actor, alias, name)
                notice = f"{name} now serves {alias}; the replicas that served drain and leave."
            else:
                await deployment_roles.rollback(admin_service, actor, alias, name)
                notice = f"Rolled back {name}: it takes no new session; what it runs finishes."
        except GatewayError as exc:  # shown in the panel, beside the replica; nothing changed
            errors = {name: f"{exc.param}: {exc.message}" if exc.param else exc.message}
            return await self._panel(request, admin_service, alias, status=exc.status, row_errors=errors)
        return await self._panel(request, admin_service, alias, notice=notice)

    @get("/compare")
    async def compare(self, request: AdminRequest, swap_figures: Swaps) -> Template:
        """The Compare view: the serving pool's figures beside each candidate's, over the window."""
        alias = request.query_params.get("name", "")
        figures = swap_figures(alias)
        pools = figures["pools"]
        columns = [("serving pool", _column(pools["serving"]))] if "serving" in pools else []
        for d in figures["deployments"]:
            if d["role"] != "serving" and d["name"] in pools:
                columns.append((f"{d['name']} ({d['role']})", _column(pools[d["name"]])))
        context = {"alias": alias, "columns": columns, "window_s": figures["window_s"], "shadow": figures["shadow"]}
        return Template("model_compare.html", context=context)
