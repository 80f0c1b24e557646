"""The admin page for lanes and task policies: the lists, and a form per policy whose
errors are shown next to it."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Template

from laneway.admin.forms import form_of, policy_input
from laneway.admin.guards import AdminRequest, AdminSession, NotLoggedIn
from laneway.admin.policies import LANE_FIELDS, TASK_FIELDS, LaneIn, TaskIn, put_lane, put_task
from laneway.admin.service import AdminService, row
from laneway.admin.ui import Page, to_login
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import PolicyRepository


class PolicyPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _policies_page(self, svc: AdminService, current: AdminSession, **extra: Any) -> Template:
        async with svc.sessions() as session:
            repo = PolicyRepository(session)
            lanes = [row(x, LANE_FIELDS) for x in await repo.lanes()]
            tasks = [row(t, TASK_FIELDS) for t in await repo.task_policies()]
        capped: dict[str, list[str]] = {}
        for cap in svc.lane_caps():
            capped.setdefault(cap.lane, []).append(f"{cap.deployment} ({cap.sequences} sequences)")
        for lane in lanes:
            lane["caps"] = capped.get(str(lane["name"]), [])
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
        return await self._edit_policy(request, admin_service, name, LaneIn, put_lane, name)

    @post("/tasks/{task:str}")
    async def edit_task(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], task: FromPath[str]
    ) -> Page:
        return await self._edit_policy(request, admin_service, task, TaskIn, put_task, f"task:{task}")

    async def _edit_policy(
        self, request: AdminRequest, svc: AdminService, name: str, kind: type[Any], apply: Any, key: str
    ) -> Page:
        current, form = request.user, await form_of(request)
        try:
            data, sent = policy_input(form, kind)
            await apply(svc, current.username, name, data, sent)
        except GatewayError as exc:  # shown inline, next to the form that sent it
            if exc.param in ("name", "task"):  # a bad name in the path: there is no form to show it by
                return await self._policies_page(svc, current, error=exc.message)
            return await self._policies_page(svc, current, errors={key: exc.message})
        return await self._policies_page(svc, current, notice=f"Saved {name}. The gateway applies it now.")
