"""The route tester's answer in words: a RoutePlan (what the pipeline's own code decided) told
as the lane and the rule that matched, the max_tokens and where it came from, the stops, the
limits the request would meet, and the replicas that could serve it. The decisions are the
plan's; this module only says them (and reads each lane's rule with the router's own
LanePolicy.matches)."""

from __future__ import annotations

from typing import Any

from laneway.admin.dependencies import RoutePlan, RoutingFigures
from laneway.admin.policy_help import lane_rule
from laneway.admin.presentation import replica_state
from laneway.core.policy import DEFAULT_LANE, LanePolicy
from laneway.engines.registry import EngineRegistry, LiveDeployment
from laneway.types import TenantSnapshot


def _rule(lane: LanePolicy) -> str:
    return lane_rule(
        {
            "match_stream": lane.match_stream,
            "match_max_prompt_tokens": lane.match_max_prompt_tokens,
            "match_tasks": sorted(lane.match_tasks) if lane.match_tasks is not None else None,
        }
    )


def lanes_tried(plan: RoutePlan) -> tuple[list[dict[str, Any]], str]:
    """Each lane in match order with its rule and whether the request matches it, and why the
    chosen lane took it."""
    call, lanes = plan.call, plan.policies.lanes
    rows = [
        {
            "name": lane.name,
            "rule": _rule(lane),
            "chosen": lane.name == call.lane.name,
            "matches": lane.matches(prompt_tokens=call.generation.prompt_tokens, stream=call.stream, task=call.task),
        }
        for lane in lanes
    ]
    if plan.explicit_lane:
        why = f"named by the request (X-Laneway-Lane: {plan.explicit_lane}), which its tenant may do"
    elif not lanes:
        why = f"no lanes are set: every request joins the default lane '{DEFAULT_LANE.name}'"
    elif any(r["matches"] for r in rows):
        first = next(r for r in rows if r["matches"])
        why = f"the first lane whose rule it matches: {first['rule']}"
    else:
        why = "no lane's rule matches it: the last lane takes it"
    return rows, why


def max_tokens_said(plan: RoutePlan) -> list[str]:
    """Where the request's max_tokens came from, as PolicySnapshot.max_tokens decides it."""
    call = plan.call
    prompt = call.generation.prompt_tokens
    policy = plan.policies.tasks.get(call.task) if call.task else None
    lines = []
    if policy is None:
        lines.append(f"task '{call.task or 'none'}' has no policy: the gateway's default, {plan.default_max_tokens}")
    else:
        lines.append(f"task '{policy.task}' allows {policy.max_tokens}")
        if policy.long_prompt_tokens is not None:
            long = prompt > policy.long_prompt_tokens
            cap = policy.long_prompt_max_tokens or policy.max_tokens
            lines.append(
                f"a prompt over {policy.long_prompt_tokens} tokens gets at most {cap}: this one "
                f"({prompt}) {'does' if long else 'does not'}"
            )
    asked = plan.requested_max_tokens
    lines.append(f"the request asks for {asked}" if asked else "the request sets no max_tokens")
    room = call.deployment.engine.info.max_model_len - prompt
    lines.append(f"the context leaves room for {room} ({call.deployment.engine.info.max_model_len} - {prompt})")
    return lines


def limits_said(plan: RoutePlan, tenant: TenantSnapshot) -> dict[str, Any]:
    call = plan.call
    reserve = call.generation.prompt_tokens + call.generation.n * call.generation.max_tokens
    lane = call.lane
    return {
        "reserve": reserve,
        "rpm": tenant.rpm,
        "tpm": tenant.tpm,
        "concurrency": tenant.max_concurrency,
        "lane": lane,
        "too_large": tenant.tpm is not None and reserve > tenant.tpm,
    }


def _why_not(d: LiveDeployment, plan: RoutePlan) -> str:
    call = plan.call
    lanes = d.spec.config.get("lanes")
    if not d.engine.info.generates:
        return "serves embeddings only"
    if d.draining:
        return "draining"
    if not d.healthy:
        return "ejected"
    if lanes is not None and call.lane.name not in lanes:
        return f"dedicated to {', '.join(lanes)}"
    if not call.needs <= d.engine.info.capabilities:
        return "lacks " + ", ".join(sorted(call.needs - d.engine.info.capabilities))
    return "dedicated replicas of this lane come first" if plan.pick is not None else "not chosen at arrival"


def replicas_said(plan: RoutePlan, registry: EngineRegistry, figures: RoutingFigures) -> list[dict[str, Any]]:
    """Every replica of the alias that served: a candidate or why not, and the one picked."""
    call, placed = plan.call, figures()
    chosen = plan.pick.replica if plan.pick is not None else call.deployment
    candidates = {id(d) for d in plan.replicas}
    out = []
    for d in registry.replicas(call.alias):
        out.append(
            {
                "name": d.spec.name,
                "engine": d.spec.engine_kind,
                "candidate": id(d) in candidates,
                "picked": d is chosen,
                "why_not": "" if id(d) in candidates else _why_not(d, plan),
                **replica_state(d, placed.get(d.spec.name)),
            }
        )
    return out
