"""The admin web UI: server-rendered Jinja pages (admin/templates), enhanced with htmx
(vendored in admin/static, no CDN). It uses the same sessions, CSRF tokens and admin
operations (admin/service.py) as the JSON API; every form carries the session's CSRF token.
"""

from __future__ import annotations

import secrets
from typing import Any

import msgspec
from litestar import Controller, Request, get, post
from litestar.datastructures import Cookie
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template
from sqlalchemy import select

from laneway.admin import deployments, keys, policies, tenants
from laneway.admin.api import MAX_PAGE, MAX_PER_PAGE, Logins, open_session, tenant_page
from laneway.admin.deployments import ModelIn
from laneway.admin.guards import (
    OPTIONAL,
    PUBLIC,
    SESSION_COOKIE,
    AdminRequest,
    AdminSession,
    MaybeAdminRequest,
    NotLoggedIn,
    check_csrf,
)
from laneway.admin.keys import KEY_FIELDS, KeyIn
from laneway.admin.limits import KEY_LIMIT_FIELDS, KeyLimitsIn, tenant_usage
from laneway.admin.live import LiveFigures
from laneway.admin.policies import LANE_FIELDS, TASK_FIELDS, LaneIn, TaskIn
from laneway.admin.presentation import LIMIT_FIELDS, audit_changes, field_message, iso_utc, typed_tenant
from laneway.admin.security import token_digest
from laneway.admin.service import AUDIT_FIELDS, AdminService, get_or_404, row
from laneway.admin.tenants import TENANT_FIELDS, TenantIn
from laneway.admin.validation import check_text, convert, int_query
from laneway.contracts.errors import GatewayError
from laneway.core.pipeline import Gateway
from laneway.db.models import ApiKey, Tenant
from laneway.db.repositories import AdminRepository, AuditRepository, ModelRepository, PolicyRepository
from laneway.engines.registry import ENGINE_KINDS
from laneway.resources import ADMIN_TEMPLATES, package_dir

# Package data: templates/ and static/ next to this module, found from any working directory.
ADMIN_UI_DIR = package_dir(ADMIN_TEMPLATES).parent
LOGIN_CSRF_COOKIE = "laneway_login_csrf"
PER_PAGE = 25

Page = Template | Redirect


async def _first_login(logins: Logins) -> dict[str, str] | None:
    """How to get in, while no admin has ever logged in: where the first start wrote the
    generated password, or how to create an admin."""
    async with logins.sessions() as session:
        repo = AdminRepository(session)
        if await repo.anyone_logged_in():
            return None
        has_admin = await repo.count() > 0
    password_file = logins.password_file
    if has_admin and password_file.is_file():
        return {"username": "admin", "password_file": str(password_file.resolve())}
    return {"username": "", "password_file": ""} if not has_admin else None


def to_login(_: Request, __: NotLoggedIn) -> Redirect:  # type: ignore[type-arg]
    """The pages' answer to a request without a live session (the JSON API's is a 401)."""
    return Redirect("/admin/login", status_code=303)


async def _form(request: Request) -> dict[str, str]:  # type: ignore[type-arg]
    return {k: str(v) for k, v in (await request.form()).items()}


def _tenant_input(form: dict[str, str]) -> tuple[TenantIn, set[str]]:
    """Form strings -> a validated TenantIn: empty number fields clear the limit, comma lists
    (allowed models, allowed lanes) clear when empty, an empty priority floor is 0."""
    raw: dict[str, Any] = {}
    for field in ("weight", "rpm", "tpm", "max_concurrency", "priority_floor", "tokens_per_day", "tokens_per_month"):
        if field in form:
            text = form[field].strip()
            raw[field] = (0 if field == "priority_floor" else None) if text == "" else text
    if "name" in form:
        raw["name"] = form["name"].strip()
    for field in ("allowed_models", "allowed_lanes"):
        if field in form:
            raw[field] = [m.strip() for m in form[field].split(",") if m.strip()] or None
    if "csrf_token" in form and "name" not in form:  # the edit form: an unticked box is "not disabled"
        raw["disabled"] = form.get("disabled") == "true"
    return convert(raw, TenantIn, strict=False), set(raw)


def _key_limits_input(form: dict[str, str]) -> dict[str, Any]:
    """The key-limit inputs of a form: an empty number clears the limit, the model list is
    comma separated (empty: every model the tenant may use)."""
    raw: dict[str, Any] = {}
    for field in KEY_LIMIT_FIELDS:
        if field not in form:
            continue
        text = form[field].strip()
        if field == "allowed_models":
            raw[field] = [m.strip() for m in text.split(",") if m.strip()] or None
        else:
            raw[field] = text or None
    return raw


def _page_number(raw: str | None) -> int:
    """The HTML list clamps a page it cannot show (a stale or hand-edited link) to the first."""
    try:
        return max(1, int(raw or "1"))
    except ValueError:
        return 1


class AdminUI(Controller):
    """Behind the admin guards (admin/guards.py): logged out, a page redirects to the login;
    every POST carries the session's CSRF token in its form."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    @get("/", opt=OPTIONAL)
    async def home(self, request: MaybeAdminRequest) -> Redirect:
        return Redirect("/admin/dashboard" if request.user is not None else "/admin/login", status_code=303)

    @get("/login", opt=PUBLIC)
    async def login_page(self, logins: NamedDependency[Logins]) -> Template:
        token = secrets.token_urlsafe(24)
        cookie = Cookie(key=LOGIN_CSRF_COOKIE, value=token, path="/admin", httponly=True, samesite="strict")
        return Template("login.html", context={"login_csrf": token, "first_login": await _first_login(logins)},
                        cookies=[cookie])  # fmt: skip

    @post("/login", opt=PUBLIC)
    async def login(self, request: Request, logins: NamedDependency[Logins]) -> Page:  # type: ignore[type-arg]
        form = await _form(request)
        expected = request.cookies.get(LOGIN_CSRF_COOKIE, "")  # no session yet: the login form's own token
        try:
            check_csrf(form.get("csrf_token", ""), expected)
            cookie, _ = await open_session(request, logins, form.get("username", ""), form.get("password", ""))
        except GatewayError as exc:  # 401 wrong, 429 throttled (with Retry-After), 400 bad username
            return Template("login.html", context={"login_csrf": expected, "error": exc.message},
                            status_code=exc.status, headers=exc.headers)  # fmt: skip
        return Redirect("/admin/dashboard", status_code=303, cookies=[cookie])  # the live view first

    @post("/logout", opt=OPTIONAL)
    async def logout(self, request: MaybeAdminRequest, admin_service: NamedDependency[AdminService]) -> Redirect:
        if request.user is not None:  # the guard checked the form's CSRF token
            async with admin_service.sessions() as session, session.begin():
                await AdminRepository(session).close_session(token_digest(request.cookies[SESSION_COOKIE]))
        return Redirect(
            "/admin/login", status_code=303, cookies=[Cookie(key=SESSION_COOKIE, value="", path="/admin", max_age=0)]
        )

    @get("/tenants")
    async def tenants(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        """?q= and ?page= (clamped: below 1 is 1, past the end is the last page); ?per_page=
        (1..200) and a q with control characters re-render the list with the error and 400."""
        params = request.query_params
        try:
            q = check_text("q", params.get("q", ""), max_length=120, allow_empty=True)
            per_page = int_query("per_page", params.get("per_page"), default=PER_PAGE, lo=1, hi=MAX_PER_PAGE)
        except GatewayError as exc:
            return await self._tenants_page(admin_service, request.user, list_error=exc.message, status=400)
        page = _page_number(params.get("page"))
        return await self._tenants_page(admin_service, request.user, q=q, page=page, per_page=per_page)

    async def _tenants_page(
        self,
        svc: AdminService,
        current: AdminSession,
        *,
        q: str = "",
        page: int = 1,
        per_page: int = PER_PAGE,
        error: str = "",
        list_error: str = "",
        status: int = 200,
        error_field: str | None = None,
        typed: dict[str, str] | None = None,
    ) -> Template:
        page = min(page, MAX_PAGE)
        found, total = await tenant_page(svc.sessions, q, page, per_page)
        last = max(1, -(-total // per_page))
        if page > last:
            page = last
            found, total = await tenant_page(svc.sessions, q, page, per_page)
        context = {"admin": current.username, "csrf": current.csrf, "tenants": found, "total": total, "q": q,
                   "page": page, "per_page": per_page, "error": error, "list_error": list_error}  # fmt: skip
        # A rejected create form comes back as typed, its message next to the field.
        context |= {"typed": typed or {}, "error_field": error_field, "limit_fields": LIMIT_FIELDS}
        return Template("tenants.html", context=context, status_code=status)

    @post("/tenants")
    async def create_tenant(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        form = await _form(request)
        try:
            data, _ = _tenant_input(form)
            created = await tenants.create_tenant(admin_service, request.user.username, data)
        except GatewayError as exc:
            return await self._tenants_page(admin_service, request.user, error=field_message(exc.param, exc.message),
                                            status=exc.status, error_field=exc.param, typed=form)  # fmt: skip
        return Redirect(f"/admin/tenants/{created['id']}", status_code=303)

    async def _tenant_page(
        self,
        svc: AdminService,
        gateway: Gateway,
        current: AdminSession,
        tenant_id: int,
        status: int | None = None,
        **extra: Any,
    ) -> Template:
        async with svc.sessions() as session:
            tenant = await get_or_404(session, Tenant, tenant_id)
            rows = await session.execute(select(ApiKey).where(ApiKey.tenant_id == tenant_id).order_by(ApiKey.id))
            context = {"admin": current.username, "csrf": current.csrf, "tenant": row(tenant, TENANT_FIELDS),
                       "keys": [row(k, KEY_FIELDS) for k in rows.scalars()],
                       "usage": await tenant_usage(gateway.limiter, session, tenant),
                       **extra}  # fmt: skip
        context["limit_fields"] = LIMIT_FIELDS
        if extra.get("typed"):  # a rejected edit: show what was typed, not the stored values
            context["tenant"] = typed_tenant(context["tenant"], extra["typed"])
        failed = extra.get("error") or extra.get("key_error") or extra.get("key_errors")
        return Template("tenant.html", context=context, status_code=status or (400 if failed else 200))

    @get("/tenants/{tenant_id:int}")
    async def tenant(
        self,
        request: AdminRequest,
        admin_service: NamedDependency[AdminService],
        gateway: NamedDependency[Gateway],
        tenant_id: FromPath[int],
    ) -> Page:
        return await self._tenant_page(admin_service, gateway, request.user, tenant_id)

    @post("/tenants/{tenant_id:int}")
    async def edit_tenant(
        self,
        request: AdminRequest,
        admin_service: NamedDependency[AdminService],
        gateway: NamedDependency[Gateway],
        tenant_id: FromPath[int],
    ) -> Page:
        current, form = request.user, await _form(request)
        try:
            data, fields = _tenant_input(form)
            await tenants.edit_tenant(admin_service, current.username, tenant_id, data, fields)
        except GatewayError as exc:
            if exc.status == 404:
                raise
            return await self._tenant_page(admin_service, gateway, current, tenant_id,
                                           error=field_message(exc.param, exc.message), status=exc.status,
                                           error_field=exc.param, typed=form)  # fmt: skip
        return await self._tenant_page(admin_service, gateway, current, tenant_id,
                                       notice="Saved. The gateway applies it now.")  # fmt: skip

    @post("/tenants/{tenant_id:int}/keys")
    async def issue_key(
        self,
        request: AdminRequest,
        admin_service: NamedDependency[AdminService],
        gateway: NamedDependency[Gateway],
        tenant_id: FromPath[int],
    ) -> Page:
        current, form = request.user, await _form(request)
        raw = {"name": form.get("name", "default").strip() or "default",
               "expires_days": form.get("expires_days", "").strip() or None, **_key_limits_input(form)}  # fmt: skip
        try:
            data = convert(raw, KeyIn, strict=False)
            issued = await keys.issue_api_key(admin_service, current.username, tenant_id, data)
        except GatewayError as exc:
            if exc.status == 404:
                raise
            return await self._tenant_page(admin_service, gateway, current, tenant_id, key_error=exc.message,
                                           status=exc.status)  # fmt: skip
        return await self._tenant_page(admin_service, gateway, current, tenant_id, secret=issued["secret"])

    @post("/keys/{key_id:int}/limits")
    async def edit_key_limits(
        self,
        request: AdminRequest,
        admin_service: NamedDependency[AdminService],
        gateway: NamedDependency[Gateway],
        key_id: FromPath[int],
    ) -> Page:
        """The key row's form: its own rpm, tpm, max concurrency and models (empty: the tenant's)."""
        current, form = request.user, await _form(request)
        async with admin_service.sessions() as session:
            tenant_id = (await get_or_404(session, ApiKey, key_id)).tenant_id
        raw = _key_limits_input(form)
        try:
            await keys.edit_api_key(admin_service, current.username, key_id,
                                       convert(raw, KeyLimitsIn, strict=False), set(raw))  # fmt: skip
        except GatewayError as exc:  # shown on the key's row
            return await self._tenant_page(admin_service, gateway, current, tenant_id,
                                           key_errors={key_id: exc.message}, status=exc.status)  # fmt: skip
        return await self._tenant_page(admin_service, gateway, current, tenant_id, notice="Saved the key's limits. "
                                       "The gateway applies them now.")  # fmt: skip

    @post("/keys/{key_id:int}/revoke")
    async def revoke_key(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], key_id: FromPath[int]
    ) -> Page:
        revoked = await keys.revoke_api_key(admin_service, request.user.username, key_id)
        return Redirect(f"/admin/tenants/{revoked['tenant_id']}", status_code=303)


def _policy_input(form: dict[str, str], kind: type[Any]) -> tuple[Any, set[str]]:
    """Form strings -> a validated LaneIn/TaskIn and the fields the form sent (the policy form
    sends every field): numbers, true/false, comma lists; an empty input clears the field
    (refused for one that must have a value)."""
    raw: dict[str, Any] = {}
    for field in kind.__struct_fields__:
        if field not in form:
            continue
        text = form[field].strip()
        if text == "":
            raw[field] = None
        elif field in ("match_tasks", "stop"):
            raw[field] = [x for x in text.split(",") if x]
        else:
            raw[field] = text
    return convert(raw, kind, strict=False), set(raw)


class AdminPages(Controller):
    """Policies, models, audit log and the live dashboard (behind the same guards as AdminUI)."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _policies_page(self, svc: AdminService, current: AdminSession, **extra: Any) -> Template:
        async with svc.sessions() as session:
            repo = PolicyRepository(session)
            lanes = [row(x, LANE_FIELDS) for x in await repo.lanes()]
            tasks = [row(t, TASK_FIELDS) for t in await repo.task_policies()]
        context = {"admin": current.username, "csrf": current.csrf, "lanes": lanes, "tasks": tasks,
                   "lane_fields": [f for f in LANE_FIELDS if f != "name"], "errors": {}, **extra}  # fmt: skip
        status = 400 if extra.get("errors") or extra.get("error") else 200
        return Template("policies.html", context=context, status_code=status)

    @get("/policies")
    async def policies(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        return await self._policies_page(admin_service, request.user)

    @post("/lanes/{name:str}")
    async def edit_lane(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], name: FromPath[str]
    ) -> Page:
        return await self._edit_policy(request, admin_service, name, LaneIn, policies.put_lane, name)

    @post("/tasks/{task:str}")
    async def edit_task(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], task: FromPath[str]
    ) -> Page:
        return await self._edit_policy(request, admin_service, task, TaskIn, policies.put_task, f"task:{task}")

    async def _edit_policy(
        self, request: AdminRequest, svc: AdminService, name: str, kind: type[Any], apply: Any, key: str
    ) -> Page:
        current, form = request.user, await _form(request)
        try:
            data, sent = _policy_input(form, kind)
            await apply(svc, current.username, name, data, sent)
        except GatewayError as exc:  # shown inline, next to the form that sent it
            if exc.param in ("name", "task"):  # a bad name in the path: there is no form to show it by
                return await self._policies_page(svc, current, error=exc.message)
            return await self._policies_page(svc, current, errors={key: exc.message})
        return await self._policies_page(svc, current, notice=f"Saved {name}. The gateway applies it now.")

    async def _models_page(
        self,
        svc: AdminService,
        gateway: Gateway,
        current: AdminSession,
        status: int | None = None,
        **extra: Any,
    ) -> Template:
        registry = gateway.registry
        async with svc.sessions() as session:
            specs = await ModelRepository(session).enabled_deployments()
        deployments = [
            {"alias": s.alias, "name": s.name, "engine": s.engine_kind, "quantization": s.quantization,
             "gpu_type": s.gpu_type, "max_model_len": s.max_model_len,
             "state": "failed" if s.name in registry.failed else "warm" if s.name in registry.warm else "starting"}
            for s in specs
        ]  # fmt: skip
        context = {"admin": current.username, "csrf": current.csrf, "deployments": deployments,
                   "engine_kinds": sorted(ENGINE_KINDS), **extra}  # fmt: skip
        return Template("models.html", context=context, status_code=status or (400 if extra.get("error") else 200))

    @get("/models")
    async def models(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], gateway: NamedDependency[Gateway]
    ) -> Page:
        return await self._models_page(admin_service, gateway, request.user)

    @post("/models")
    async def set_model(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], gateway: NamedDependency[Gateway]
    ) -> Page:
        current, form = request.user, await _form(request)
        try:
            config = msgspec.json.decode(form.get("config") or "{}")
        except msgspec.DecodeError:
            return await self._models_page(admin_service, gateway, current,
                                           error="config must be a JSON object, e.g. {}.")  # fmt: skip
        deployment = {"name": form.get("name", "").strip(), "engine_kind": form.get("engine_kind", ""),
                      "config": config, "max_model_len": form.get("max_model_len", "").strip() or 2048}  # fmt: skip
        alias = form.get("alias", "").strip()
        try:
            data = convert({"deployments": [deployment]}, ModelIn, strict=False)
            result = await deployments.put_model(admin_service, current.username, alias, data)
        except GatewayError as exc:  # shown on the page; nothing was changed
            return await self._models_page(admin_service, gateway, current, error=exc.message, status=exc.status)
        served = ", ".join(result["deployments"]) or "nothing (see failures)"
        return await self._models_page(admin_service, gateway, current, notice=f"{alias} is served by {served}.")

    @get("/audit")
    async def audit(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        current = request.user
        async with admin_service.sessions() as session:
            entries = [{**row(e, AUDIT_FIELDS), "at": iso_utc(e.at), "changes": audit_changes(e.before, e.after)}
                       for e in await AuditRepository(session).recent(200)]  # fmt: skip
        return Template("audit.html", context={"admin": current.username, "csrf": current.csrf, "entries": entries})

    def _panel_context(self, gateway: Gateway, live: LiveFigures) -> dict[str, Any]:
        """Queues now (the schedulers) and the last minutes of this replica's metrics: no
        database round trip, whatever the traffic."""
        queues = [{"lane": labels["lane"], "deployment": labels["deployment"], "waiting": w, "running": r}
                  for labels, w, r in gateway.queue_stats()]  # fmt: skip
        view = live.read()
        scale = max([t.ttft_ms[0.99] or 0.0 for t in view.lanes] + [1.0])
        return {"queues": queues, "view": view, "ttft": [t for t in view.lanes if t.ttft_n], "scale": scale,
                "span": _span_words(view.span_s)}  # fmt: skip

    @get("/dashboard")
    async def dashboard(
        self, request: AdminRequest, gateway: NamedDependency[Gateway], live: NamedDependency[LiveFigures]
    ) -> Page:
        context = {"admin": request.user.username, "csrf": request.user.csrf, **self._panel_context(gateway, live)}
        return Template("dashboard.html", context=context)

    @get("/dashboard/panel")
    async def panel(self, gateway: NamedDependency[Gateway], live: NamedDependency[LiveFigures]) -> Page:
        return Template("dashboard_panel.html", context=self._panel_context(gateway, live))


def _span_words(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 5400:
        return f"{round(seconds / 60)} min"
    return f"{seconds / 3600:.1f} h"
