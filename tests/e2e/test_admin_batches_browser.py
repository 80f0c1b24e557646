"""The batches page in a real Chromium: every tenant's batches with status and progress, the
progress moving by itself (htmx poll) as the runner answers requests, the tenant filter, and
Cancel (asked first) moving a batch to cancelling, in the audit log; no Cancel on an ended
batch; the page fits a 390 px screen. Screenshots for docs/admin.md."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest
from laneway.db.batch_store import BatchStore
from laneway.db.repositories import TenantRepository
from laneway.db.session import make_engine, make_sessionmaker
from support import Gateway, sim_model, start_gateway
from support.browser import browser_or_skip, chromium_page, doc_shot, log_in, no_csp_violations

PASSWORD = "correct horse battery"
OWNER = "replica-a"


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    browser_or_skip()
    seed = {"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}, "globex": {}}}
    # No runner: the test answers the lines itself, through the store, to watch the page follow.
    gateway = start_gateway(
        tmp_path_factory.mktemp("batches-ui"), seed_with=seed, admin_password=PASSWORD, batch_runner=False
    )
    yield gateway
    gateway.stop()


def on_store(gw: Gateway, work):  # type: ignore[no-untyped-def]
    """Run `work(store, tenant ids by name)` against the gateway's database, as the runner would;
    in a thread of its own, since Playwright's sync API holds this thread's event loop."""

    async def go():  # type: ignore[no-untyped-def]
        engine = make_engine(gw.database_url)
        try:
            sessions = make_sessionmaker(engine)
            async with sessions() as s:
                ids = {name: (await TenantRepository(s).get_by_name(name)).id for name in ("acme", "globex")}
            return await work(BatchStore(sessions), ids)
        finally:
            await engine.dispose()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, go()).result()


async def create(store: BatchStore, tenant_id: int, n: int, answered: int = 0) -> str:
    items = [(f"req-{i}", json.dumps({"model": "sim", "messages": []})) for i in range(n)]
    batch = await store.create_batch(
        tenant_id,
        "k" * 64,
        "/v1/chat/completions",
        "file-in",
        "24h",
        None,
        datetime.now(UTC) + timedelta(days=1),
        items,
    )
    await answer(store, batch.id, answered)
    return batch.id


async def answer(store: BatchStore, batch_id: str, n: int) -> None:
    for item in await store.claim(batch_id, OWNER, n, 60):
        await store.finish(item.id, OWNER, "succeeded", "{}")


def test_the_batches_page_shows_progress_filters_and_cancels(gw: Gateway) -> None:
    from playwright.sync_api import expect

    async def seed(store: BatchStore, ids: dict[str, int]) -> tuple[str, str, str]:
        ended = await create(store, ids["globex"], 2, answered=2)
        assert await store.to_finalize(OWNER, 60) == [ended]
        await store.complete(ended, OWNER, "completed", b"{}\n", None)
        nightly = await create(store, ids["acme"], 40, answered=12)
        running = await create(store, ids["globex"], 8, answered=3)
        return ended, nightly, running

    ended, nightly, running = on_store(gw, seed)
    console: list[str] = []
    with chromium_page(gw.base_url, console) as page:
        log_in(page, PASSWORD, "/admin/batches")
        page.get_by_role("link", name="Batches").click()  # the nav link
        expect(page.locator("h1")).to_have_text("Batches")
        rows = page.locator("#batches tbody tr")
        expect(rows).to_have_count(3)
        expect(rows.nth(0)).to_have_attribute("id", f"batch-{running}")  # newest first
        row = page.locator(f"#batch-{nightly}")
        expect(row.locator(".status")).to_have_text("in progress")
        expect(row.locator(".count")).to_have_text("12 / 40")
        expect(row.locator("progress")).to_have_attribute("value", "12")
        expect(page.locator(f"#batch-{ended} .status")).to_have_text("completed")
        expect(page.locator(f"#batch-{ended}").get_by_role("button")).to_have_count(0)  # nothing to cancel

        on_store(gw, lambda store, _: answer(store, nightly, 8))  # the runner answers 8 more
        expect(row.locator(".count")).to_have_text("20 / 40", timeout=15_000)  # by the poll, no reload
        doc_shot(page, "batches")

        page.select_option("#batch-tenant", "acme")
        page.get_by_role("button", name="Show").click()
        expect(page.locator("#batches tbody tr")).to_have_count(1)
        assert "tenant=acme" in page.url

        dialogs: list[str] = []

        def refuse(dialog) -> None:  # type: ignore[no-untyped-def]
            dialogs.append(dialog.message)
            dialog.dismiss()

        page.once("dialog", refuse)
        row.get_by_role("button", name=f"Cancel {nightly}").click()
        expect(page.locator("#notice")).to_have_count(0)  # dismissed: nothing sent
        assert dialogs and dialogs[0].startswith(f"Cancel batch {nightly} of acme?")
        page.once("dialog", lambda d: d.accept())
        row.get_by_role("button", name=f"Cancel {nightly}").click()
        expect(page.locator("#notice")).to_contain_text(f"Batch {nightly} of acme is cancelling")
        expect(page.locator(f"#batch-{nightly}")).to_have_attribute("data-status", "cancelling")
        expect(page.locator(f"#batch-{nightly}").get_by_role("button")).to_have_count(0)
        assert "tenant=acme" in page.url and "/cancel" not in page.url  # a reload reads the list again

        page.goto("/admin/audit")
        expect(page.locator("#audit tr", has_text=f"cancel batch {nightly}")).to_contain_text("in_progress")

        page.set_viewport_size({"width": 390, "height": 844})
        page.goto("/admin/batches")
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        doc_shot(page, "phone-batches")
    no_csp_violations(console)
