"""Cache- and load-aware routing over real sockets (issue 27): three engine replicas as real
processes on loopback (the vLLM protocol stand-in), the official SDK as the client. What
laneway must do is place requests; the stand-ins only count what reaches each of them."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import REDIS_URL, StandInProcess, require_service, stand_in_deployment, start_gateway, start_stand_ins

SYSTEM = "You are the support assistant of a bicycle shop. Answer briefly and politely. " * 30


@pytest.fixture(scope="module")
def trio() -> Iterator[list[StandInProcess]]:
    replicas = start_stand_ins(3, token_delay_s=0.01)
    yield replicas
    for r in replicas:
        r.stop()


PASSWORD = "correct horse battery"


def gateway(tmp_path: Path, trio: list[StandInProcess], *, slots: int = 4, **settings: Any) -> Any:
    models = {
        "m": [
            stand_in_deployment(f"m-{i}", r.base_url, max_concurrency=slots, **settings.pop("config", {}))
            for i, r in enumerate(trio)
        ]
    }
    lanes = [
        {
            "name": "standard",
            "max_concurrency": slots,
            "max_queue_depth": 500,
            "queue_timeout_s": 30,
            "max_unacked_tokens": 100_000,
        }
    ]
    return start_gateway(
        tmp_path,
        seed_with={"models": models, "lanes": lanes, "tenants": {"acme": {}, "beta": {}}},
        usage_flush_interval_s=0.05,
        admin_password=PASSWORD,
        **settings,
    )


def models_page(gw: Any) -> str:
    browser = httpx.Client(base_url=gw.base_url)
    login = browser.get("/admin/login").text
    csrf = login.split('name="csrf_token" value="')[1].split('"')[0]
    form = {"csrf_token": csrf, "username": "admin", "password": PASSWORD}
    assert browser.post("/admin/login", data=form).status_code == 303
    return browser.get("/admin/models").text


def counts(trio: list[StandInProcess]) -> list[int]:
    return [r.received for r in trio]


def where(before: list[int], after: list[int]) -> list[int]:
    """The replicas that received requests between two readings."""
    return [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]


async def ask(client: openai.AsyncOpenAI, messages: list[dict[str, str]], **kw: Any) -> str:
    answer = await client.chat.completions.create(model="m", messages=messages, max_tokens=4, **kw)  # type: ignore[arg-type]
    return answer.choices[0].message.content or ""


async def test_a_second_turn_and_a_prompt_cache_key_go_back_to_their_replica(
    tmp_path: Path, trio: list[StandInProcess]
) -> None:
    gw = await asyncio.to_thread(gateway, tmp_path, trio)
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        homes_seen = set()
        for conversation in range(4):  # several conversations, each with its own history
            turn = [
                {"role": "system", "content": f"Conversation {conversation}. " + SYSTEM},
                {"role": "user", "content": "Do you sell tyres?"},
            ]
            before = counts(trio)
            reply = await ask(client, turn)
            [home] = where(before, counts(trio))
            turn += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And tubes?"}]
            before = counts(trio)
            await ask(client, turn)
            assert where(before, counts(trio)) == [home], f"conversation {conversation}'s second turn moved"
            homes_seen.add(home)
        assert len(homes_seen) > 1  # spread over the replicas, not all on the first listed
        # A prompt_cache_key keeps a session on its replica however little its prompts share.
        homes = set()
        for prompt in ("Hi", "Something else entirely", "A third question"):
            before = counts(trio)
            await ask(client, [{"role": "user", "content": prompt}], prompt_cache_key="session-42")
            homes.update(where(before, counts(trio)))
        assert len(homes) == 1
        metrics = await asyncio.to_thread(lambda: httpx.get(gw.base_url + "/metrics").text)
        assert 'laneway_routing_decisions_total{alias="m",deployment="m-' in metrics
        assert 'reason="prefix"' in metrics and 'reason="session"' in metrics
        assert 'laneway_routing_prefix_tokens_total{alias="m",deployment="m-' in metrics
        # The models page shows each replica's state, load and estimated hit rate.
        page = await asyncio.to_thread(models_page, gw)
        assert page.count('class="health-healthy"') == 3 and "0 / 4" in page
        assert re.search(r"<td>\d+% of \d+ requests</td>", page), "no hit rate shown"
        assert "running," in page and "waiting, KV" in page  # the stand-ins' reported load
    finally:
        await asyncio.to_thread(gw.stop)


async def test_a_hot_prefix_spreads_once_its_replica_is_saturated(tmp_path: Path, trio: list[StandInProcess]) -> None:
    gw = await asyncio.to_thread(gateway, tmp_path, trio, slots=2)
    try:
        client = openai.AsyncOpenAI(base_url=gw.api_url, api_key=gw.keys["acme"], max_retries=0)
        hot = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Opening hours?"}]
        await ask(client, hot)  # the prefix now lives on one replica
        before = counts(trio)
        await asyncio.gather(
            *(
                client.chat.completions.create(model="m", messages=hot, max_tokens=40)  # type: ignore[arg-type]
                for _ in range(6)
            )
        )
        spread = [a - b for a, b in zip(counts(trio), before, strict=True)]
        assert sum(spread) == 6 and max(spread) < 6 and sum(1 for n in spread if n) >= 2, spread
    finally:
        await asyncio.to_thread(gw.stop)


async def test_two_gateways_sharing_redis_route_a_conversation_alike(
    tmp_path: Path, trio: list[StandInProcess]
) -> None:
    require_service("Redis", "127.0.0.1", 6379)
    shared = {"redis_url": REDIS_URL, "redis_prefix": f"lwtest:{uuid.uuid4().hex}:"}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = await asyncio.to_thread(gateway, tmp_path / "one", trio, config={"shared_slots": True}, **shared)
    two = await asyncio.to_thread(gateway, tmp_path / "two", trio, config={"shared_slots": True}, **shared)
    all_homes = set()
    try:
        clients = [openai.AsyncOpenAI(base_url=g.api_url, api_key=g.keys["acme"], max_retries=0) for g in (one, two)]
        for conversation in range(5):
            turn = [
                {"role": "system", "content": f"Ticket {conversation}. " + SYSTEM},
                {"role": "user", "content": "Where is my order?"},
            ]
            homes = []
            for i, client in enumerate((clients[0], clients[1], clients[0])):  # turns alternate gateways
                before = counts(trio)
                reply = await ask(client, turn)
                homes += where(before, counts(trio))
                turn += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"Follow-up {i}"}]
            assert len(set(homes)) == 1, f"conversation {conversation} went to replicas {homes}"
            all_homes.update(homes)
        assert len(all_homes) > 1  # the conversations are spread, each one kept in place
    finally:
        await asyncio.to_thread(one.stop)
        await asyncio.to_thread(two.stop)
