"""The admin page for lanes and task policies: a form per lane and per task policy with
labels, units and help (admin/policy_help.py), add and delete, the lanes moved up and down,
and what each lane's limits mean against the deployments it feeds. Every change goes through
the admin service (admin/policies.py): the API's checks and words, an audit row, NOTIFY."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from litestar import Controller, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Template

from laneway.admin import policies
from laneway.admin.forms import form_lists, form_of, policy_input
from laneway.admin.guards import AdminRequest, AdminSession, NotLoggedIn
from laneway.admin.policies import LANE_FIELDS, TASK_FIELDS, LaneIn, TaskIn
from laneway.admin.policy_help import (
    EMPTY_STOP_BOXES,
    LANE_LIMIT_FIELDS,
    LANE_RULE_FIELDS,
    TASK_FIELDS_HELP,
    field_value,
    lane_rule,
)
from laneway.admin.service import AdminService, row
from laneway.admin.ui import Page, to_login
from laneway.contracts.errors import GatewayError
from laneway.db.repositories import PolicyRepository

NEW_LANE, NEW_TASK = "new-lane", "new-task"  # the add forms' keys for errors and typed values


def _feeds(svc: AdminService, lane: str, cap: int | None) -> list[dict[str, Any]]:
    """The served deployments that take this lane's requests, and how many of each one's
    sequences the lane's cap, where it has one, leaves unused (a silent throughput limit otherwise)."""
    if svc.registry is None:
        return []
    out = []
    for d in svc.registry.deployments():
        lanes = d.spec.config.get("lanes")
        if lanes is not None and lane not in lanes:
            continue
        sequences = d.engine.info.max_concurrency
        out.append(
            {
                "name": d.spec.name,
                "alias": d.spec.alias,
                "sequences": sequences,
                "dedicated": lanes is not None,
                "unused": 0 if cap is None else max(0, sequences - cap),
            }
        )
    return out


def _shown(stored: dict[str, Any], typed: dict[str, str] | None) -> dict[str, str]:
    """A policy's values as its form shows them: what a refused save typed, else the stored ones."""
    values = {k: field_value(v) for k, v in stored.items()}
    return {**values, **typed} if typed else values


class PolicyPages(Controller):
    """Behind the admin guards (admin/guards.py), as every page."""

    path = "/admin"
    include_in_schema = False
    exception_handlers = {NotLoggedIn: to_login}

    async def _policies_page(
        self,
        svc: AdminService,
        current: AdminSession,
        *,
        errors: dict[str, tuple[str | None, str]] | None = None,
        typed: dict[str, dict[str, Any]] | None = None,
        status: int | None = None,
        **extra: Any,
    ) -> Template:
        errors, typed = errors or {}, typed or {}
        async with svc.sessions() as session:
            repo = PolicyRepository(session)
            lanes = [row(x, LANE_FIELDS) for x in await repo.lanes()]
            tasks = [row(t, TASK_FIELDS) for t in await repo.task_policies()]
        for lane in lanes:
            name = str(lane["name"])
            lane["rule"] = lane_rule(lane)
            lane["feeds"] = _feeds(svc, name, lane["max_concurrency"])
            lane["shown"] = _shown(lane, typed.get(name))
        for task in tasks:
            key = f"task:{task['task']}"
            task["shown"] = _shown(task, typed.get(key))
            stops = typed[key].get("stop_list", task["stop"]) if key in typed else task["stop"]
            task["stops"] = [*stops, *[""] * EMPTY_STOP_BOXES]
        context = {
            "admin": current.username,
            "csrf": current.csrf,
            "lanes": lanes,
            "tasks": tasks,
            "rule_fields": LANE_RULE_FIELDS,
            "limit_fields": LANE_LIMIT_FIELDS,
            "task_fields": TASK_FIELDS_HELP,
            "errors": errors,
            "typed": typed,
            "new_lane": NEW_LANE,
            "new_task": NEW_TASK,
            "new_stops": [*typed.get(NEW_TASK, {}).get("stop_list", []), *[""] * EMPTY_STOP_BOXES],
            **extra,
        }
        code = status or (400 if errors or extra.get("error") else 200)
        # Whatever form was sent, the address bar shows the page (htmx): a reload reads it, not the form's action.
        return Template(
            "policies.html", context=context, status_code=code, headers={"HX-Replace-Url": "/admin/policies"}
        )

    @get("/policies")
    async def policies(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        return await self._policies_page(admin_service, request.user)

    # ---- lanes ----
    @post("/lanes")
    async def add_lane(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        form = await form_of(request)
        name = form.get("name", "").strip()

        async def apply(data: Any, sent: set[str]) -> Any:
            return await policies.put_lane(admin_service, request.user.username, name, data, sent, new=True)

        return await self._save(
            request,
            admin_service,
            NEW_LANE,
            LaneIn,
            apply,
            f"Added the lane {name} (last: move it up to have its rule tried earlier).",
            form=_filled(form),
        )

    @post("/lanes/{name:str}")
    async def edit_lane(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], name: FromPath[str]
    ) -> Page:
        async def apply(data: Any, sent: set[str]) -> Any:
            return await policies.put_lane(admin_service, request.user.username, name, data, sent)

        saved = f"Saved {name}. The gateway applies it now."
        return await self._save(request, admin_service, name, LaneIn, apply, saved)

    @post("/lanes/{name:str}/move")
    async def move_lane(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], name: FromPath[str]
    ) -> Page:
        form = await form_of(request)
        up = form.get("direction") == "up"
        return await self._act(
            admin_service,
            request.user,
            name,
            lambda: policies.move_lane(admin_service, request.user.username, name, -1 if up else 1),
            f"Moved {name} {'up' if up else 'down'}: its rule is now tried {'earlier' if up else 'later'}.",
        )

    @post("/lanes/{name:str}/delete")
    async def delete_lane(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], name: FromPath[str]
    ) -> Page:
        return await self._act(
            admin_service,
            request.user,
            name,
            lambda: policies.delete_lane(admin_service, request.user.username, name),
            f"Deleted the lane {name}.",
        )

    # ---- task policies ----
    @post("/tasks")
    async def add_task(self, request: AdminRequest, admin_service: NamedDependency[AdminService]) -> Page:
        form = await form_of(request)
        task = form.get("task", "").strip()

        async def apply(data: Any, sent: set[str]) -> Any:
            return await policies.put_task(admin_service, request.user.username, task, data, sent, new=True)

        return await self._save(
            request, admin_service, NEW_TASK, TaskIn, apply, f"Added the task policy {task}.", form=_filled(form)
        )

    @post("/tasks/{task:str}")
    async def edit_task(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], task: FromPath[str]
    ) -> Page:
        async def apply(data: Any, sent: set[str]) -> Any:
            return await policies.put_task(admin_service, request.user.username, task, data, sent)

        return await self._save(
            request, admin_service, f"task:{task}", TaskIn, apply, f"Saved {task}. The gateway applies it now."
        )

    @post("/tasks/{task:str}/delete")
    async def delete_task(
        self, request: AdminRequest, admin_service: NamedDependency[AdminService], task: FromPath[str]
    ) -> Page:
        return await self._act(
            admin_service,
            request.user,
            f"task:{task}",
            lambda: policies.delete_task(admin_service, request.user.username, task),
            f"Deleted the task policy {task}: its requests get the default max_tokens now.",
        )

    # ---- shared ----
    async def _save(
        self,
        request: AdminRequest,
        svc: AdminService,
        key: str,
        kind: type[Any],
        apply: Callable[[Any, set[str]], Awaitable[Any]],
        notice: str,
        *,
        form: dict[str, str] | None = None,
    ) -> Page:
        """Validate and save one policy form; a refusal is shown next to the field it names
        (or atop the form), with what was typed kept."""
        form = form if form is not None else await form_of(request)
        lists = await form_lists(request, "stop") if kind is TaskIn else {}
        try:
            data, sent = policy_input(form, kind, lists)
            await apply(data, sent)
        except GatewayError as exc:
            typed: dict[str, Any] = {**form, "stop_list": [s for s in lists.get("stop", []) if s]}
            if kind is LaneIn:  # an unticked box sends nothing: show it unticked, as it was sent
                typed.setdefault("background", "false")
            param = (exc.param or "").split("[")[0] or None  # stop[2] is shown by the stop list
            return await self._policies_page(
                svc, request.user, errors={key: (param, exc.message)}, typed={key: typed}, status=exc.status
            )
        return await self._policies_page(svc, request.user, notice=notice)

    async def _act(
        self, svc: AdminService, current: AdminSession, key: str, act: Callable[[], Awaitable[Any]], notice: str
    ) -> Page:
        try:
            await act()
        except GatewayError as exc:  # refused (a lane a deployment is dedicated to): said on its card
            return await self._policies_page(svc, current, errors={key: (None, exc.message)}, status=exc.status)
        return await self._policies_page(svc, current, notice=notice)


def _filled(form: dict[str, str]) -> dict[str, str]:
    """An add form without its blank inputs: a new policy takes the defaults for those."""
    return {k: v for k, v in form.items() if v.strip() != ""}
