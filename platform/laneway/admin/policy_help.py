"""How the Lanes & policies page says things: each lane and task policy field's label, unit
and line of help (as the tenants page does for limits), and a lane's rule in words.

The messages of a refused save stay the admin service's own (the API's words), shown next to
the field they name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laneway.admin.presentation import FieldHelp
from laneway.admin.validation import INT32_MAX
from laneway.core.slo import MAX_TPOT_TARGET_MS, MAX_TTFT_TARGET_MS

_ANY = "Blank = any."
LANE_RULE_FIELDS: dict[str, FieldHelp] = {
    f.name: f
    for f in (
        FieldHelp(
            "match_max_prompt_tokens",
            "Prompts up to",
            "tokens",
            "Takes requests whose prompt has at most this many tokens, as the model's engine counts them. "
            "Blank = any length.",
            "",
            placeholder="any length",
        ),
        FieldHelp(
            "match_stream",
            "Streaming",
            "",
            "Takes streaming requests (stream: true) only, non-streaming ones only, or both.",
            "",
            kind="select",
            choices=(("", "Streaming or not"), ("true", "Streaming only"), ("false", "Non-streaming only")),
        ),
        FieldHelp(
            "match_tasks",
            "Tasks",
            "comma separated",
            "Takes requests whose task is one of these: the X-Laneway-Task header or metadata.laneway_task "
            f"(chat requests without one are 'chat'). {_ANY}",
            "",
            kind="text",
            placeholder="any task",
        ),
    )
}
LANE_LIMIT_FIELDS: dict[str, FieldHelp] = {
    f.name: f
    for f in (
        FieldHelp(
            "priority",
            "Priority",
            "lower runs first",
            "When several lanes wait for the same engine, the lowest number is served first; lanes below "
            "still get a small share of the slots (LANEWAY_LANE_STARVATION_SHARE).",
            "",
            min=str(-INT32_MAX),
            placeholder="0",
        ),
        FieldHelp(
            "max_concurrency",
            "Concurrency per replica",
            "requests at once",
            "Optional. Empty (the default): no cap of the lane's own; each replica runs as many as its "
            "running limit, learned against the lanes' TPOT targets, allows. A number is a policy ceiling "
            "on the lane's requests one deployment runs at once (the rest wait in the queue); below the "
            "engine's own sequence limit the lane leaves seats unused (see the deployments it feeds).",
            "",
            placeholder="none",
        ),
        FieldHelp(
            "max_queue_depth",
            "Queue depth",
            "requests per replica",
            "Requests of this lane that may wait, per deployment serving it; one more is refused with 503 "
            "queue_full. Tenants share a full queue by weight (503 tenant_queue_share).",
            "",
            placeholder="64",
        ),
        FieldHelp(
            "queue_timeout_s",
            "Queue timeout",
            "seconds",
            "The longest a request waits for a slot (503 queue_timeout after it); one predicted to wait "
            "longer is refused at once (503 predicted_wait_exceeded). Tie it to the lane's latency goal.",
            "",
            step="any",
            min="0.001",
            max="86400",
            placeholder="10",
        ),
        FieldHelp(
            "ttft_target_ms",
            "TTFT target",
            "ms",
            "The time to first token this lane aims for, from arrival (queue wait and prefill included): "
            "requests are counted as meeting it or not (laneway_slo_met_total / laneway_slo_total). A tenant "
            "granted a minimum may ask for tighter with X-Laneway-TTFT-Target-Ms. At most the queue timeout, "
            "which stays the hard bound. Blank = no target.",
            "",
            max=str(MAX_TTFT_TARGET_MS),
            placeholder="no target",
        ),
        FieldHelp(
            "tpot_target_ms",
            "Inter-token target",
            "ms per token",
            "The time per output token after the first this lane aims for (a stream's pace); 100 ms is 10 "
            "tokens a second, ahead of a reader. Blank = no target.",
            "",
            max=str(MAX_TPOT_TARGET_MS),
            placeholder="no target",
        ),
        FieldHelp(
            "retry_after_s",
            "Retry-After",
            "seconds",
            "What this lane's refusals tell the client to wait before trying again (the Retry-After header).",
            "",
            max="86400",
            placeholder="1",
        ),
        FieldHelp(
            "max_unacked_tokens",
            "Unread stream buffer",
            "tokens",
            "Tokens a stream may have sent that the client has not read yet; a slower reader has its "
            "generation cut (backpressure), so its slot goes to someone who reads.",
            "",
            placeholder="256",
        ),
        FieldHelp(
            "background",
            "Background (batch work)",
            "",
            "Its requests take an engine slot only when no request of a foreground lane could start now, "
            "whatever the priorities, and hand it back as they end; a foreground request that finds no "
            "slot takes one back from it at once (the batch line runs again later). "
            "Give it a high concurrency so a batch can use an idle engine.",
            "",
            kind="checkbox",
        ),
    )
}
LANE_FIELDS_HELP = {**LANE_RULE_FIELDS, **LANE_LIMIT_FIELDS}

TASK_FIELDS_HELP: dict[str, FieldHelp] = {
    f.name: f
    for f in (
        FieldHelp(
            "max_tokens",
            "Max tokens",
            "tokens",
            "The most tokens a request of this task may generate; a client asking for fewer gets what it "
            "asked, one asking for more (or nothing) gets this.",
            "",
            placeholder="384",
        ),
        FieldHelp(
            "long_prompt_tokens",
            "Long prompt from",
            "prompt tokens",
            "Prompts longer than this count as long and get the long-prompt cap below. Blank = no long-prompt rule.",
            "",
            placeholder="none",
        ),
        FieldHelp(
            "long_prompt_max_tokens",
            "Max tokens for a long prompt",
            "tokens",
            "The cap for a long prompt (never above Max tokens). Blank = Max tokens.",
            "",
            placeholder="max tokens",
        ),
        FieldHelp(
            "repetition_ngram",
            "Stop a loop of",
            "words",
            "Ends an answer (finish_reason stop, its engine slot freed) once its last this-many words have "
            "appeared Repeats times: a small model stuck in a loop. Blank = off, for tasks that repeat on "
            "purpose.",
            "",
            placeholder="off",
        ),
        FieldHelp(
            "repetition_count",
            "Repeats",
            "times",
            "How many times those words must appear before the answer is ended.",
            "",
            placeholder="3",
        ),
        FieldHelp(
            "json_stop",
            "End JSON when complete",
            "",
            "In the JSON modes, the answer ends where its top-level value ends, when the engine would go on.",
            "",
            kind="select",
            choices=(("true", "Yes"), ("false", "No")),
        ),
        FieldHelp(
            "stop",
            "Stop sequences",
            "one per box",
            "Generation ends at any of these, merged with the request's own and the model's defaults. "
            "Empty a box to remove it; save to get more empty boxes.",
            "",
            kind="list",
        ),
    )
}

EMPTY_STOP_BOXES = 2  # blank stop inputs under a task's list, for new ones


def lane_rule(lane: Mapping[str, Any]) -> str:
    """The lane's rule in words, as the router reads it (core/policy.py LanePolicy.matches)."""
    parts = []
    if lane.get("match_stream") is True:
        parts.append("streaming requests")
    elif lane.get("match_stream") is False:
        parts.append("non-streaming requests")
    limit = lane.get("match_max_prompt_tokens")
    if limit is not None:
        parts.append(f"prompts up to {limit:,} tokens")
    tasks = lane.get("match_tasks")
    if tasks is not None:
        parts.append(f"task {' or '.join(tasks)}" if tasks else "no task (matches nothing by rule)")
    return ", ".join(parts) if parts else "every request (a catch-all)"


def field_value(value: Any) -> str:
    """A stored value as the form shows it: blank for none, true/false, comma lists."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)
