import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from laneway.bootstrap import issue_key
from laneway.contracts.errors import GatewayError
from laneway.core.auth import KeyAuthenticator, hash_secret, new_api_key
from laneway.db.repositories import KeyRows, TenantRepository, UsageRepository
from laneway.db.session import make_sessionmaker
from laneway.usage import UsageRecorder
from sqlalchemy.ext.asyncio import AsyncEngine
from support import until
from support.usage import usage_record


def test_new_keys_are_unique_and_only_the_hash_is_derived() -> None:
    a, prefix, digest = new_api_key()
    b, _, _ = new_api_key()
    assert a != b and a.startswith("lw-") and prefix == a[:10] and digest == hash_secret(a)
    assert a not in digest


async def test_authenticate_caches_and_sees_revocation_within_the_ttl(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme", weight=2.0, rpm=10, allowed_models=["tiny"])
    key_id, secret = await issue_key(sessions, "acme")
    auth = KeyAuthenticator(sessions, ttl_s=0.2)
    tenant = await auth.authenticate(f"Bearer {secret}")
    assert (tenant.name, tenant.weight, tenant.rpm, tenant.api_key_id) == ("acme", 2.0, 10, key_id)
    assert tenant.may_use("tiny") and not tenant.may_use("other")
    await auth.authenticate(f"Bearer {secret}")
    assert auth.lookups == 1  # second call served from cache

    async with sessions() as s, s.begin():
        await TenantRepository(s).revoke_key(key_id)

    async def refused() -> bool:
        try:
            await auth.authenticate(f"Bearer {secret}")
        except GatewayError as exc:
            assert exc.status == 401 and "revoked" in exc.message
            return True
        return False

    await until(refused, within=1.0, step=0.02, what="the revoked key refused")


async def test_key_rows_are_typed_as_the_orm_types_them(db_engine: AsyncEngine) -> None:
    """KeyRows reads through the driver (the sweeps' cheap path) and still gives what a select
    through SQLAlchemy gives: datetimes, lists, booleans, floats, on SQLite and PostgreSQL."""
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create(
            "typed",
            weight=2.5,
            allowed_models=["a", "b"],
            allowed_lanes=["x"],
            tokens_per_day=10**12,
            disabled=True,
            budget_per_month=5 * 10**12,
        )
    expires = datetime.now(UTC) + timedelta(days=1)
    key_id, secret = await issue_key(sessions, "typed", expires_at=expires)
    async with sessions() as s, s.begin():
        await TenantRepository(s).revoke_key(key_id)
        key = await TenantRepository(s).find_key(hash_secret(secret))
        assert key is not None
        orm = (
            key.secret_sha256,
            key.id,
            key.revoked_at,
            key.expires_at,
            key.rpm,
            key.tpm,
            key.max_concurrency,
            key.allowed_models,
            key.tenant.id,
            key.tenant.name,
            key.tenant.weight,
            key.tenant.rpm,
            key.tenant.tpm,
            key.tenant.max_concurrency,
            key.tenant.allowed_models,
            key.tenant.allowed_lanes,
            key.tenant.priority_floor,
            key.tenant.tokens_per_day,
            key.tenant.tokens_per_month,
            key.tenant.disabled,
            key.tenant.budget_per_day,
            key.tenant.budget_per_month,
            key.budget_per_day,
            key.budget_per_month,
            key.tenant.min_ttft_target_ms,
        )
    rows = await KeyRows(db_engine)([hash_secret(secret), hash_secret("lw-nobody")])
    assert rows == [orm]
    [row] = rows
    assert isinstance(row[2], datetime) and isinstance(row[3], datetime) and row[7] is None
    assert row[14] == ["a", "b"] and row[15] == ["x"] and row[19] is True and row[10] == 2.5
    assert row[21] == 5 * 10**12  # BIGINT micro-units


@pytest.mark.parametrize("header", [None, "", "Basic abc", "Bearer ", "Bearer lw-nope"])
async def test_missing_or_bad_keys_are_401(db_engine: AsyncEngine, header: str | None) -> None:
    auth = KeyAuthenticator(make_sessionmaker(db_engine))
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(header)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"


async def test_expired_key_and_disabled_tenant_are_refused(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("old")
        await TenantRepository(s).create("off", disabled=True)
    _, expired = await issue_key(sessions, "old", expires_at=datetime.now(UTC) - timedelta(seconds=1))
    _, disabled = await issue_key(sessions, "off")
    auth = KeyAuthenticator(sessions)
    with pytest.raises(GatewayError, match="expired") as info:
        await auth.authenticate(f"Bearer {expired}")
    assert info.value.status == 401
    with pytest.raises(GatewayError, match="disabled") as info:
        await auth.authenticate(f"Bearer {disabled}")
    assert info.value.status == 403


async def test_recorder_writes_in_batches_and_touches_keys(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme")
    key_id, secret = await issue_key(sessions, "acme")
    recorder = UsageRecorder(sessions, interval_s=60, batch_size=10)  # only a full batch wakes it
    await recorder.start()
    for i in range(25):
        recorder.record(usage_record(i, key_id))
    await until(lambda: recorder.written >= 20, within=5, step=0.01, what="20 rows written")
    await recorder.stop()  # flushes the remainder
    assert recorder.written == 25 and recorder.pending == 0
    async with sessions() as s:
        assert len(await UsageRepository(s).for_tenant(1)) == 25
        key = await TenantRepository(s).find_key(hash_secret(secret))
        assert key is not None and key.last_used_at is not None


async def test_an_expiring_entry_under_load_is_looked_up_once(db_engine: AsyncEngine) -> None:
    """Single flight: 200 requests with the same key arriving when its entry expired cost one
    database round trip, not 200 (which drained the connection pool)."""
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme")
    _, secret = await issue_key(sessions, "acme")
    auth = KeyAuthenticator(sessions, ttl_s=0.05, keep_warm_s=0)  # not kept fresh by sweeps
    await auth.authenticate(f"Bearer {secret}")
    await asyncio.sleep(0.06)  # time passing is the point (not a fake clock: the sweeps' timer is the loop's): expired
    tenants = await asyncio.gather(*(auth.authenticate(f"Bearer {secret}") for _ in range(200)))
    assert {t.name for t in tenants} == {"acme"} and auth.lookups == 2


async def test_known_keys_are_served_from_cache_while_the_database_is_unreachable(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme")
    _, secret = await issue_key(sessions, "acme")
    _, never_seen = await issue_key(sessions, "acme")
    clock = [1000.0]
    auth = KeyAuthenticator(sessions, ttl_s=0.5, stale_s=300, clock=lambda: clock[0])
    assert (await auth.authenticate(f"Bearer {secret}")).name == "acme"

    async def broken(_: str) -> Any:
        raise ConnectionRefusedError("database down")

    auth._lookup = broken  # type: ignore[method-assign]
    clock[0] += 10  # expired, but seen 10 s ago
    assert (await auth.authenticate(f"Bearer {secret}")).name == "acme"
    with pytest.raises(GatewayError) as info:  # a key never seen: 503, not 500
        await auth.authenticate(f"Bearer {never_seen}")
    assert info.value.status == 503 and info.value.code == "database_unavailable"
    clock[0] += 400  # beyond the staleness bound: no longer trusted
    with pytest.raises(GatewayError) as info:
        await auth.authenticate(f"Bearer {secret}")
    assert info.value.status == 503


async def _tenant_and_key(sessions: Any, **limits: Any) -> tuple[int, str]:
    """A tenant "acme" (with these limits) and one key of it: (key id, secret)."""
    async with sessions() as s, s.begin():
        await TenantRepository(s).create("acme", **limits)
    return await issue_key(sessions, "acme")


async def _no_sweep_in_flight(auth: KeyAuthenticator) -> None:
    """A sweep's query counts in lookups when sent, in sweeps when answered: wait for its answer."""
    await until(lambda: auth._sweeping is None, what="the sweep answered")


async def _many_keys(sessions: Any, n: int) -> list[str]:
    """n keys of one tenant, in one transaction; their secrets."""
    secrets: list[str] = []
    async with sessions() as s, s.begin():
        repo = TenantRepository(s)
        tenant = await repo.create("many")
        for i in range(n):
            secret, prefix, digest = new_api_key()
            await repo.add_key(tenant, prefix=prefix, secret_sha256=digest, name=f"k{i}")
            secrets.append(secret)
    return secrets


async def test_keys_in_use_are_confirmed_together_and_their_requests_never_wait(db_engine: AsyncEngine) -> None:
    """300 keys each used every 0.5 s, longer than the 0.4 s ttl: the sweeps confirm them all
    in one query each, so after the first use no request looks its key up (before: every
    request of such a key waited on its own lookup, and a key in steady use cost ~2.7 lookups
    a second, each its own query)."""
    sessions = make_sessionmaker(db_engine)
    secrets = await _many_keys(sessions, 300)
    auth = KeyAuthenticator(sessions, ttl_s=0.4)
    try:
        for secret in secrets:
            await auth.authenticate(f"Bearer {secret}")
        await _no_sweep_in_flight(auth)
        assert auth.lookups - auth.sweeps == 300  # each key's first use: looked up on its request
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.6
        while loop.time() < end:
            for secret in secrets:
                assert (await auth.authenticate(f"Bearer {secret}")).name == "many"
            await asyncio.sleep(0.5)  # time passing is the point: each key used every 0.5 s
        await _no_sweep_in_flight(auth)
        assert auth.sweeps >= 4
        assert auth.lookups - auth.sweeps == 300  # one query a sweep for all 300; none on a request
    finally:
        await auth.close()


async def test_sweeps_stop_when_no_key_is_in_use_and_never_carry_guessed_keys(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    _, secret = await _tenant_and_key(sessions)
    auth = KeyAuthenticator(sessions, ttl_s=0.1, keep_warm_s=0.3)
    try:
        await auth.authenticate(f"Bearer {secret}")
        for _ in range(50):  # a client guessing keys: each is refused, none is swept
            with pytest.raises(GatewayError):
                await auth.authenticate(f"Bearer lw-guess-{new_api_key()[0]}")
        assert set(auth._used) <= {hash_secret(secret)}
        await auth.authenticate(f"Bearer {secret}")
        await until(lambda: auth.sweeps >= 1, within=1, what="a sweep")
        # idle past keep_warm_s: the key leaves the sweeps, which stop
        await until(
            lambda: not (auth._used or auth._sweep_timer is not None or auth._sweeping is not None),
            within=5,
            step=0.05,
            what="the sweeps stopped with no key in use",
        )
        sweeps, lookups = auth.sweeps, auth.lookups
        await asyncio.sleep(0.3)  # time passing is the point: no sweep while idle
        assert (auth.sweeps, auth.lookups) == (sweeps, lookups)
        await auth.authenticate(f"Bearer {secret}")  # used again: looked up on its request, swept again
        assert auth.lookups == lookups + 1
        await until(lambda: auth.sweeps > sweeps, within=1, what="swept again")
    finally:
        await auth.close()


async def test_a_sweep_sees_revocations_and_does_not_outlive_an_admin_change(db_engine: AsyncEngine) -> None:
    sessions = make_sessionmaker(db_engine)
    key_id, secret = await _tenant_and_key(sessions, rpm=10)
    auth = KeyAuthenticator(sessions, ttl_s=0.2)
    try:
        assert (await auth.authenticate(f"Bearer {secret}")).rpm == 10
        async with sessions() as s, s.begin():
            tenant = await TenantRepository(s).get_by_name("acme")
            assert tenant is not None
            tenant.rpm = 20
        await asyncio.sleep(0.25)  # a sweep ran: the entry holds the new limit, no request looked it up
        lookups = auth.lookups
        assert (await auth.authenticate(f"Bearer {secret}")).rpm == 20 and auth.lookups == lookups
        # An answer the database gave before an admin change is not served fresh after it.
        auth._store(hash_secret(secret), None, auth._generation, 0.0)
        auth.invalidate()
        assert (await auth.authenticate(f"Bearer {secret}")).rpm == 20  # looked up again
        assert auth.lookups == lookups + 1
        async with sessions() as s, s.begin():
            await TenantRepository(s).revoke_key(key_id)
        await asyncio.sleep(0.25)
        with pytest.raises(GatewayError, match="revoked"):
            await auth.authenticate(f"Bearer {secret}")
    finally:
        await auth.close()


async def test_after_an_admin_change_the_keys_in_use_cost_one_query_not_one_each(db_engine: AsyncEngine) -> None:
    """invalidate() (an admin change) starts a sweep at once and the requests of the keys in
    use wait for it: 200 keys' next requests cost one query, and see the change; a second
    change while that sweep runs starts another, whose answer is the one served."""
    sessions = make_sessionmaker(db_engine)
    secrets = await _many_keys(sessions, 200)
    auth = KeyAuthenticator(sessions, ttl_s=5.0)  # no timed sweep during the test
    try:
        for secret in secrets:
            assert (await auth.authenticate(f"Bearer {secret}")).rpm is None
        async with sessions() as s, s.begin():
            tenant = await TenantRepository(s).get_by_name("many")
            assert tenant is not None
            tenant.rpm = 7
        lookups = auth.lookups
        auth.invalidate()
        tenants = await asyncio.gather(*(auth.authenticate(f"Bearer {secret}") for secret in secrets))
        assert {t.rpm for t in tenants} == {7}
        assert auth.lookups == lookups + 1  # the sweep's one query: no request looked its key up
        async with sessions() as s, s.begin():
            tenant = await TenantRepository(s).get_by_name("many")
            assert tenant is not None
            tenant.rpm = 8
        auth.invalidate()
        first = auth._sweeping
        async with sessions() as s, s.begin():
            tenant = await TenantRepository(s).get_by_name("many")
            assert tenant is not None
            tenant.rpm = 9
        auth.invalidate()  # while the first sweep may still run: a newer one answers
        assert auth._sweeping is not first
        tenants = await asyncio.gather(*(auth.authenticate(f"Bearer {secret}") for secret in secrets))
        assert {t.rpm for t in tenants} == {9}
        assert auth.lookups <= lookups + 3
    finally:
        await auth.close()
    assert not auth._sweeps


async def test_a_frozen_database_during_a_sweep_costs_a_request_one_timeout_then_the_cache(
    db_engine: AsyncEngine,
) -> None:
    """A request that waits for a sweep which the database never answers gets the last known
    answer after one lookup timeout, not after a second wait on a lookup of its own."""
    sessions = make_sessionmaker(db_engine)
    _, secret = await _tenant_and_key(sessions)
    auth = KeyAuthenticator(sessions, ttl_s=5.0, lookup_timeout_s=1.0)
    try:
        await auth.authenticate(f"Bearer {secret}")
        never = asyncio.Event()

        async def frozen(_: list[str]) -> Any:
            await never.wait()

        auth._lookup = frozen  # type: ignore[method-assign]
        auth.invalidate()  # the sweep it starts hangs
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert (await auth.authenticate(f"Bearer {secret}")).name == "acme"
        assert loop.time() - t0 < 1.8  # one timeout (1 s); a second wait would make it 2 s or more
        assert auth.served_stale == 1
    finally:
        await auth.close()
    assert not auth._sweeps
