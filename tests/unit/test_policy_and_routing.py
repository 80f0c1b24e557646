import pytest
from laneway.contracts.errors import GatewayError
from laneway.core.policy import DEFAULT_LANE, LanePolicy, PolicySnapshot, TaskPolicy
from laneway.core.routing import LaneRouter

LANES = (
    LanePolicy(name="batch", priority=2, match_tasks=frozenset({"batch"})),
    LanePolicy(name="interactive", priority=0, match_max_prompt_tokens=511, match_stream=True),
    LanePolicy(name="standard", priority=1),
)
TASKS = {
    "chat": TaskPolicy("chat", 384, long_prompt_tokens=4000, long_prompt_max_tokens=256),
    "extract": TaskPolicy("extract", 96, stop=("\n\n",)),
    "reason": TaskPolicy("reason", 768, long_prompt_tokens=4000, long_prompt_max_tokens=256),
}
SNAP = PolicySnapshot(lanes=LANES, tasks=TASKS)


@pytest.mark.parametrize(
    ("prompt_tokens", "stream", "task", "lane"),
    [
        (100, True, None, "interactive"),  # short and streaming: the fast lane
        (511, True, "chat", "interactive"),
        (512, True, None, "standard"),  # one token too long
        (100, False, None, "standard"),  # not streaming
        (100, True, "batch", "batch"),  # batch traffic never takes the fast lane
        (9000, False, "batch", "batch"),
    ],
)
def test_first_matching_lane_wins(prompt_tokens: int, stream: bool, task: str | None, lane: str) -> None:
    assert LaneRouter().route(SNAP, prompt_tokens=prompt_tokens, stream=stream, task=task).name == lane


def test_explicit_lane_wins_and_an_unknown_one_is_a_400() -> None:
    router = LaneRouter()
    assert router.route(SNAP, prompt_tokens=9000, stream=False, task=None, explicit_lane="interactive").name == (
        "interactive"
    )
    with pytest.raises(GatewayError) as info:
        router.route(SNAP, prompt_tokens=1, stream=True, task=None, explicit_lane="vip")
    assert info.value.status == 400 and info.value.param == "X-Laneway-Lane"


def test_no_lane_matches_falls_to_the_last_and_no_lanes_means_the_default() -> None:
    only_fast = PolicySnapshot(lanes=(LANES[1], LanePolicy(name="catchall", match_stream=True)))
    assert LaneRouter().route(only_fast, prompt_tokens=9000, stream=False, task=None).name == "catchall"
    assert LaneRouter().route(PolicySnapshot(), prompt_tokens=1, stream=True, task=None) is DEFAULT_LANE


@pytest.mark.parametrize(
    ("task", "prompt_tokens", "requested", "room", "expected"),
    [
        ("extract", 100, None, 10_000, 96),
        ("chat", 100, None, 10_000, 384),
        ("reason", 100, None, 10_000, 768),
        ("chat", 4001, None, 10_000, 256),  # long prompt: tightened
        ("reason", 4001, 1000, 10_000, 256),
        ("chat", 100, 50, 10_000, 50),  # the client's own, lower
        ("chat", 100, 1000, 10_000, 384),  # never above the task cap
        ("chat", 100, None, 20, 20),  # never beyond the context left
        (None, 100, None, 10_000, 512),  # no task: the gateway default
        ("unknown", 100, 600, 10_000, 512),
    ],
)
def test_max_token_policy(
    task: str | None, prompt_tokens: int, requested: int | None, room: int, expected: int
) -> None:
    got = SNAP.max_tokens(task=task, prompt_tokens=prompt_tokens, requested=requested, room=room, default=512)
    assert got == expected


def test_stops_merge_request_task_and_model_defaults_without_duplicates() -> None:
    assert SNAP.stops(task="extract", model_stops=["</s>", "\n\n"], requested=["END", ""]) == ("END", "\n\n", "</s>")
    assert SNAP.stops(task=None, model_stops=(), requested=()) == ()
