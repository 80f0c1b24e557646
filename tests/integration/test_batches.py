"""OpenAI's Batch API through the official SDK against a served gateway: upload, create, poll,
download output and errors (chat, completions, embeddings, responses); list and cancel; every
refusal at create, in OpenAI's error shape; one tenant never sees another's files or batches;
a batch past its window expires with what it finished in its output."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from support import Gateway, sim_model, start_gateway, wait_for
from support.batches import chat_line, file_lines, jsonl, line, run_batch, upload, wait_ended

TENANTS = {"acme": {}, "other": {}, "narrow": {"allowed_models": ["fast"]}}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    models = {
        "fast": sim_model("fast", decode_ms_base=1.0, max_concurrency=4, max_model_len=512),
        "slow": sim_model("slow", decode_ms_base=400.0, max_concurrency=1),
        "embed": sim_model("embed", embeddings=True, embed_ms=1),
    }
    g = start_gateway(
        tmp_path_factory.mktemp("batches"),
        seed_with={"models": models, "tenants": TENANTS},
        usage_flush_interval_s=0.05,
        batch_poll_interval_s=0.1,
        batch_max_lines=20,
        batch_max_file_bytes=64 * 1024,
    )
    yield g
    g.stop()


def client(gw: Gateway, tenant: str = "acme") -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.api_url, api_key=gw.keys[tenant], max_retries=0)


def test_chat_batch_answers_each_line_once_and_a_bad_line_goes_to_the_error_file(gw: Gateway) -> None:
    c = client(gw)
    lines = [chat_line(f"q{i}", "fast", f"question {i}") for i in range(5)]
    lines.append(chat_line("unknown-param", "fast", "hi", bogus=1))  # a 400 for its body, at run time
    lines.append(chat_line("too-long", "fast", "word " * 2000))  # past the model's context
    lines.append(chat_line("nul", "fast", "a\u0000b"))  # a NUL in a message: escaped in the stored JSON
    batch = run_batch(c, jsonl(lines), metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.request_counts.total == 8
    assert batch.metadata == {"job": "nightly"} and batch.endpoint == "/v1/chat/completions"
    done = wait_ended(c, batch.id)
    assert done.status == "completed" and done.completed_at and done.finalizing_at and done.in_progress_at
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (8, 6, 2)
    output, errors = file_lines(c, done.output_file_id), file_lines(c, done.error_file_id)
    assert sorted(output) == ["nul", *(f"q{i}" for i in range(5))] and sorted(errors) == ["too-long", "unknown-param"]
    answer = output["q3"]
    assert answer["id"].startswith("batch_req_") and answer["error"] is None
    response = answer["response"]
    assert response["status_code"] == 200 and response["request_id"]
    assert response["body"]["object"] == "chat.completion" and response["body"]["choices"][0]["message"]["content"]
    assert response["body"]["model"] == "fast" and response["body"]["usage"]["completion_tokens"] > 0
    refused = errors["unknown-param"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "bogus"
    assert errors["too-long"]["response"]["body"]["error"]["code"] == "context_length_exceeded"
    # Every line that ran left a usage row, in the background lane.
    rows = [r for r in gw.usage_rows("acme") if r.status == 200 and r.lane == "batch"]
    assert len(rows) >= 5
    # The output file is the tenant's, downloadable, listed under purpose batch_output.
    listed = [f.id for f in c.files.list(purpose="batch_output")]
    assert done.output_file_id in listed and done.error_file_id in listed


@pytest.mark.parametrize(
    ("endpoint", "model", "body", "kind"),
    [
        ("/v1/completions", "fast", {"prompt": "Once upon", "max_tokens": 4}, "text_completion"),
        ("/v1/embeddings", "embed", {"input": ["a", "b"]}, "list"),
        ("/v1/responses", "fast", {"input": "hello", "max_output_tokens": 4}, "response"),
    ],
)
def test_other_endpoints_run_as_batches(
    gw: Gateway, endpoint: str, model: str, body: dict[str, Any], kind: str
) -> None:
    c = client(gw)
    batch = run_batch(c, jsonl(line(f"r{i}", endpoint, {"model": model, **body}) for i in range(3)), endpoint)
    done = wait_ended(c, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 3 and done.error_file_id is None
    output = file_lines(c, done.output_file_id)
    assert sorted(output) == ["r0", "r1", "r2"]
    assert all(x["response"]["body"]["object"] == kind for x in output.values())
    if endpoint == "/v1/embeddings":
        assert len(output["r0"]["response"]["body"]["data"]) == 2


def _refusal(exc: pytest.ExceptionInfo[openai.APIStatusError]) -> dict[str, Any]:
    body = exc.value.response.json()
    assert set(body) == {"error"} and {"message", "type", "param", "code"} <= set(body["error"])
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("content", "status", "needle"),
    [
        (b"not json at all\n", 400, "not valid JSON"),
        (jsonl([line("a", "/v1/completions", {"model": "fast", "prompt": "x"})]), 400, "batch's endpoint"),
        (jsonl([chat_line("a", "fast", "x"), chat_line("a", "fast", "y")]), 400, "appears twice"),
        (jsonl([chat_line("a", "nope", "x")]), 404, "does not exist"),
        (jsonl([chat_line("a", "fast", "x", stream=True)]), 400, "streamed"),
        (
            jsonl([{"custom_id": "a", "method": "GET", "url": "/v1/chat/completions", "body": {"model": "fast"}}]),
            400,
            "POST",
        ),
        (jsonl([{"custom_id": "a", "url": "/v1/chat/completions", "body": {}}]), 400, "method"),
        (jsonl(chat_line(f"l{i}", "fast", "x") for i in range(21)), 400, "at most 20"),
        (b"line with a NUL \x00 byte\n", 400, "NUL"),
        (jsonl([chat_line("a\u0000b", "fast", "x")]), 400, "control characters"),
        (jsonl([chat_line("a", "fast", "x"), chat_line("b", "slow", "x")]), 400, "one model"),
    ],
    ids=[
        "not-jsonl",
        "url-mismatch",
        "duplicate-custom-id",
        "unknown-model",
        "stream",
        "method",
        "missing-field",
        "too-many-lines",
        "nul",
        "nul-custom-id",
        "two-models",
    ],
)
def test_a_bad_input_file_is_refused_at_create(gw: Gateway, content: bytes, status: int, needle: str) -> None:
    c = client(gw)
    file_id = upload(c, content)
    with pytest.raises(openai.APIStatusError) as exc:
        c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert exc.value.status_code == status
    error = _refusal(exc)
    assert needle in error["message"] and error["param"] == "input_file_id"


def test_refusals_of_the_request_itself(gw: Gateway) -> None:
    c = client(gw)
    file_id = upload(c, jsonl([chat_line("a", "fast", "x")]))
    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=file_id, endpoint="/v1/images", completion_window="24h")  # type: ignore[arg-type]
    assert _refusal(exc)["param"] == "endpoint"
    with pytest.raises(openai.BadRequestError) as exc:
        c.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    assert _refusal(exc)["param"] == "completion_window"
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.BadRequestError) as exc:  # past the file size limit
        c.files.create(file=("x.jsonl", b"x" * (64 * 1024 + 1)), purpose="batch")
    assert _refusal(exc)["param"] == "file"
    with pytest.raises(openai.BadRequestError) as exc:
        c.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")
    assert _refusal(exc)["param"] == "purpose"
    narrow = client(gw, "narrow")
    file_id = upload(narrow, jsonl([chat_line("b", "slow", "x")]))
    with pytest.raises(openai.PermissionDeniedError) as exc:
        narrow.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "slow" in _refusal(exc)["message"]


def test_a_tenant_sees_only_its_own_files_and_batches(gw: Gateway) -> None:
    mine, theirs = client(gw), client(gw, "other")
    batch = run_batch(mine, jsonl([chat_line("a", "fast", "x")]))
    file_id = batch.input_file_id
    for call in (
        lambda: theirs.files.retrieve(file_id),
        lambda: theirs.files.content(file_id),
        lambda: theirs.files.delete(file_id),
        lambda: theirs.batches.retrieve(batch.id),
        lambda: theirs.batches.cancel(batch.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert file_id not in [f.id for f in theirs.files.list()]
    assert batch.id not in [b.id for b in theirs.batches.list()]
    with pytest.raises(openai.NotFoundError):
        theirs.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_ended(mine, batch.id)
    with pytest.raises(openai.NotFoundError):
        theirs.files.content(done.output_file_id or "")
    assert mine.files.retrieve(file_id).filename == "input.jsonl"
    assert mine.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        mine.files.retrieve(file_id)


def test_list_pages_and_cancel(gw: Gateway) -> None:
    c = client(gw, "other")
    ids = [run_batch(c, jsonl([chat_line("a", "fast", "x")])).id for _ in range(3)]
    slow = run_batch(c, jsonl(chat_line(f"s{i}", "slow", "x") for i in range(10)))
    first = c.batches.list(limit=2)
    assert [b.id for b in first.data] == [slow.id, ids[2]] and first.has_more
    second = c.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in second.data] == [ids[1], ids[0]]
    assert [b.id for b in c.batches.list(limit=2)][:4] == [slow.id, *reversed(ids)]  # the SDK follows `after`
    cancelling = c.batches.cancel(slow.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_ended(c, slow.id)
    assert done.status == "cancelled" and done.cancelled_at
    output, errors = file_lines(c, done.output_file_id), file_lines(c, done.error_file_id)
    assert len(output) + len(errors) == 10 and len(output) < 10
    assert {x["error"]["code"] for x in errors.values()} == {"batch_cancelled"}
    assert c.batches.cancel(slow.id).status == "cancelled"  # cancelling an ended batch changes nothing


def test_a_batch_past_its_window_expires_with_what_it_finished(tmp_path: Path) -> None:
    models = {"slow": sim_model("slow", decode_ms_base=150.0, max_concurrency=1)}
    g = start_gateway(
        tmp_path, seed_with={"models": models, "tenants": {"acme": {}}}, batch_poll_interval_s=0.1, batch_window_s=2.0
    )
    try:
        c = client(g)
        batch = run_batch(c, jsonl(chat_line(f"e{i}", "slow", "x", max_tokens=4) for i in range(20)))
        assert batch.expires_at - batch.created_at == 2
        done = wait_ended(c, batch.id, within=30)
        assert done.status == "expired" and done.expired_at
        output, errors = file_lines(c, done.output_file_id), file_lines(c, done.error_file_id)
        assert output and len(output) + len(errors) == 20
        assert {x["error"]["code"] for x in errors.values()} == {"batch_expired"}
        assert done.request_counts.completed == len(output) and done.request_counts.failed == len(errors)
    finally:
        g.stop()


def test_the_batch_lane_never_needs_the_tenants_lane_grant(gw: Gateway) -> None:
    """A tenant that may not choose lanes still has its batch run in the background lane, and
    a line's own laneway_lane metadata does not move it."""
    c = client(gw)
    body = chat_line("m", "fast", "x", metadata={"laneway_lane": "interactive"})
    done = wait_ended(c, run_batch(c, jsonl([body])).id)
    assert done.request_counts.completed == 1
    answer = file_lines(c, done.output_file_id)["m"]["response"]
    rows = [r for r in gw.usage_rows("acme") if r.request_id == answer["body"]["id"]]
    assert [r.lane for r in rows] == ["batch"]


def test_a_tenant_at_its_limits_waits_and_no_line_fails(tmp_path: Path) -> None:
    """A tenant allowed one request at a time: the runner's second line is refused 429
    (concurrency) and waits for the Retry-After; the batch completes with no failure."""
    models = {"fast": sim_model("fast", decode_ms_base=20.0, max_concurrency=4)}
    g = start_gateway(
        tmp_path, seed_with={"models": models, "tenants": {"single": {"max_concurrency": 1}}}, batch_poll_interval_s=0.1
    )
    try:
        c = client(g, "single")
        done = wait_ended(c, run_batch(c, jsonl(chat_line(f"w{i}", "fast", "x", max_tokens=4) for i in range(6))).id)
        assert done.status == "completed" and done.request_counts.completed == 6 and done.request_counts.failed == 0
        assert g.server.runtime.batch_runner.finished["retried"] > 0  # it was refused, and waited
        assert {r.status for r in g.usage_rows("single")} >= {200, 429}
    finally:
        g.stop()


def test_tenants_batches_share_the_engine_fairly(tmp_path: Path) -> None:
    """One slot; a big batch first, a small one from another tenant just after: the small one
    is served in turns beside the big one (weighted fair order), not behind all of it."""
    models = {"one": sim_model("one", decode_ms_base=15.0, max_concurrency=1)}
    g = start_gateway(
        tmp_path, seed_with={"models": models, "tenants": {"big": {}, "small": {}}}, batch_poll_interval_s=0.05
    )
    try:
        big, small = client(g, "big"), client(g, "small")
        first = run_batch(big, jsonl(chat_line(f"b{i}", "one", "x", max_tokens=4) for i in range(24)))
        second = run_batch(small, jsonl(chat_line(f"s{i}", "one", "x", max_tokens=4) for i in range(4)))
        done_small = wait_ended(small, second.id)
        assert done_small.status == "completed"
        progress = big.batches.retrieve(first.id)
        assert progress.status == "in_progress" and progress.request_counts.completed < 20
        assert wait_ended(big, first.id).status == "completed"
    finally:
        g.stop()


def test_a_live_request_takes_a_slot_back_from_a_batch_at_once(tmp_path: Path) -> None:
    """Batch lines on every slot (no live traffic seen): a live request preempts the line that
    started last instead of waiting for one to end; that line runs again, answered once."""
    models = {"two": sim_model("two", decode_ms_base=40.0, max_concurrency=2)}
    g = start_gateway(tmp_path, seed_with={"models": models, "tenants": {"acme": {}}}, batch_poll_interval_s=0.05)
    try:
        c = client(g)
        batch = run_batch(c, jsonl(chat_line(f"p{i}", "two", "x", max_tokens=50) for i in range(4)))
        wait_for(
            lambda: g.gateway.scheduler(g.gateway.registry.resolve("two")).running.get("batch") == 2,
            within=20,
            what="batch lines on both slots",
        )
        started = time.perf_counter()
        answer = c.chat.completions.create(model="two", messages=[{"role": "user", "content": "now"}], max_tokens=2)
        assert answer.choices[0].message.content is not None
        assert time.perf_counter() - started < 1.0  # a batch line takes 2 s: it did not wait one out
        done = wait_ended(c, batch.id, within=60)
        assert done.status == "completed" and sorted(file_lines(c, done.output_file_id)) == ["p0", "p1", "p2", "p3"]
        rows = g.usage_rows("acme")
        assert [r.error_code for r in rows if r.status == 503] == ["preempted"]
        assert g.server.runtime.batch_runner.finished["retried"] == 1
    finally:
        g.stop()


def test_ids_and_cursors_that_are_not_text_are_refused_before_the_database(pg_database: str, tmp_path: Path) -> None:
    """On PostgreSQL, whose text holds no NUL: `GET /v1/files?purpose=%00` answered 500 (the
    query reached the database; issue 37). Every id, cursor and purpose of the Files and
    Batches routes is checked at the edge: a 400 in OpenAI's shape naming the parameter."""
    models = {"fast": sim_model("fast")}
    g = start_gateway(tmp_path, database_url=pg_database, seed_with={"models": models, "tenants": {"acme": {}}})
    try:
        with httpx.Client(base_url=g.api_url, headers={"Authorization": f"Bearer {g.keys['acme']}"}) as http:
            hostile = [
                ("GET", "/files?purpose=%00", "purpose"),
                ("GET", "/files?purpose=batch%FF", "purpose"),  # not UTF-8
                ("GET", "/files?after=%00", "after"),
                ("GET", "/files?after=file-%1b", "after"),
                ("GET", "/files?order=%00", "order"),
                ("GET", "/files/file-%00", "file_id"),
                ("GET", "/files/file-%00/content", "file_id"),
                ("DELETE", "/files/file-%00", "file_id"),
                ("GET", "/batches?after=%00", "after"),
                ("GET", "/batches/batch_%00", "batch_id"),
                ("POST", "/batches/batch_%00/cancel", "batch_id"),
            ]
            for method, path, param in hostile:
                r = http.request(method, path)
                assert r.status_code == 400, (path, r.status_code, r.text)
                error = r.json()["error"]
                assert error["param"] == param and error["type"] == "invalid_request_error", (path, error)
            body = {"input_file_id": "file-\u0000", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
            r = http.post("/batches", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id", r.text
            # The same routes with plain text: answered as before.
            assert http.get("/files", params={"purpose": "batch", "after": "file-x"}).json()["data"] == []
            assert http.get("/files/file-nope").status_code == 404
            assert http.get("/batches", params={"after": "batch_x"}).json()["data"] == []
    finally:
        g.stop()
