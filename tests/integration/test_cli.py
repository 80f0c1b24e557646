"""The `laneway` command end to end, in subprocesses, against a fresh SQLite database."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
from support import EXE, free_port, serve, sim_model, start_gateway, wait_for


@pytest.fixture
def cli(tmp_path: Path):  # type: ignore[no-untyped-def]
    env = {**os.environ, "LANEWAY_DATA_DIR": str(tmp_path)}

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([EXE, *args], env=env, capture_output=True, text=True, timeout=120, check=check)

    run.env = env  # type: ignore[attr-defined]
    return run


def test_migrate_up_and_down(cli) -> None:  # type: ignore[no-untyped-def]
    assert "revision 0019" in cli("migrate").stdout
    assert "revision None" in cli("migrate", "--downgrade", "base").stdout
    assert "revision 0019" in cli("migrate").stdout


def test_make_demo_model_is_reproducible(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cli("make-demo-model", "--out", str(tmp_path / "a.gguf"), "--seed", "2")
    cli("make-demo-model", "--out", str(tmp_path / "b.gguf"), "--seed", "2")
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_tenant_key_model_and_serve(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cli("make-demo-model", "--out", str(tmp_path / "m.gguf"))
    cli(
        "model",
        "set",
        "mine",
        "--engine",
        "llamacpp",
        "--max-model-len",
        "256",
        "--config",
        json.dumps({"model_path": str(tmp_path / "m.gguf"), "demo": True, "parallel": 1}),
    )
    assert "created tenant" in cli("tenant", "create", "acme", "--rpm", "100", "--models", "mine").stdout
    issued = cli("key", "issue", "acme")
    secret = issued.stdout.strip()
    assert secret.startswith("lw-") and "shown only once" in issued.stderr
    assert cli("tenant", "create", "acme", check=False).returncode != 0  # names are unique

    proc, port = serve({**cli.env, "LANEWAY_BOOTSTRAP_DEMO": "false"})
    try:
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            headers={"Authorization": f"Bearer {secret}"},
            json={"model": "mine", "prompt": "hello", "max_tokens": 4},
        )
        assert r.status_code == 200 and r.json()["model"] == "mine"
        key_id = "1"
        assert cli("key", "revoke", key_id).stdout.startswith(f"revoked key {key_id} (lw-")
        models = f"http://127.0.0.1:{port}/v1/models"
        auth = {"Authorization": f"Bearer {secret}"}
        wait_for(lambda: httpx.get(models, headers=auth).status_code == 401, 5, 0.05, "the revoked key refused")
    finally:
        proc.terminate()
        proc.wait(10)


def test_first_start_on_an_empty_data_dir_is_ready_to_use(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, port = serve(cli.env)  # embedded defaults: SQLite, demo model, policies, demo tenant
    try:
        key = (tmp_path / "demo-api-key").read_text().strip()
        assert (tmp_path / "demo-api-key").stat().st_mode & 0o077 == 0  # owner-only
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key, max_retries=0)
        assert [m.id for m in client.models.list()] == ["tiny"]
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
        assert r.usage is not None and 1 <= r.usage.completion_tokens <= 5
    finally:
        proc.terminate()
        proc.wait(10)
    assert (tmp_path / "models" / "tiny-llama.gguf").is_file() and (tmp_path / "laneway.db").is_file()


def test_tenant_grants_and_key_expiry_are_validated_like_the_admin_api(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import sqlite3

    out = cli("tenant", "create", "ops", "--lanes", "batch, interactive", "--priority-floor", "-5")
    assert "created tenant ops" in out.stdout
    with sqlite3.connect(tmp_path / "laneway.db") as db:
        lanes, floor = db.execute("SELECT allowed_lanes, priority_floor FROM tenants WHERE name = 'ops'").fetchone()
    assert (json.loads(lanes), floor) == (["batch", "interactive"], -5)
    for args, field in (
        (["--priority-floor", "-5000"], "priority_floor"),
        (["--lanes", "bad\tlane"], "allowed_lanes"),
        (["--rpm", "0"], "rpm"),
    ):
        failed = cli("tenant", "create", "other", *args, check=False)
        assert failed.returncode == 1 and failed.stderr.startswith(f"laneway: {field}"), failed.stderr
        assert len(failed.stderr.strip().splitlines()) == 1
    for days in ("-1", "0", "nan", "inf", "1e400"):
        failed = cli("key", "issue", "ops", "--expires-days", days, check=False)
        assert failed.returncode == 1 and failed.stdout == "", days
        assert failed.stderr.strip() == "laneway: expires_days must be a number of days greater than 0 (at most 36500)."
    missing = cli("key", "issue", "nobody", check=False)
    assert missing.returncode == 1 and missing.stderr.strip() == "laneway: no tenant named 'nobody'"
    assert cli("key", "issue", "ops", "--expires-days", "30").stdout.startswith("lw-")
    with sqlite3.connect(tmp_path / "laneway.db") as db:
        assert db.execute("SELECT count(*) FROM api_keys WHERE expires_at IS NOT NULL").fetchone() == (1,)


@pytest.mark.parametrize(
    ("setting", "value", "said"),
    [
        ("LANEWAY_ADMIN_PASSWORD", "short", "LANEWAY_ADMIN_PASSWORD must have at least 10 characters"),
        ("LANEWAY_DEMO_MODEL", "gpt-5", "LANEWAY_DEMO_MODEL must be tiny or smollm2, not 'gpt-5'"),
    ],
)
def test_a_setting_that_cannot_work_is_one_line_not_a_traceback(cli, setting: str, value: str, said: str) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [EXE, "serve"],
        env={**cli.env, setting: value, "LANEWAY_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert out.stderr.strip() == f"laneway: {said}", out.stderr


def test_first_start_secrets_are_in_files_and_the_admin_gets_in(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The embedded defaults' first start: a demo API key and an admin with a generated
    password, each in an owner-only file that the log names (never the secret itself); the
    login page says where the password is until someone has logged in."""
    log = tmp_path / "serve.log"
    proc, port = serve(cli.env, log=log)
    base = f"http://127.0.0.1:{port}"
    try:
        password_file = tmp_path / "admin-password"
        password = password_file.read_text().strip()
        assert password_file.stat().st_mode & 0o077 == 0 and len(password) >= 20
        hint = httpx.get(base + "/admin/login").text
        assert 'id="first-login"' in hint and str(password_file) in hint
        with httpx.Client(base_url=base) as c:
            assert c.post("/admin/api/login", json={"username": "admin", "password": password}).status_code == 200
        assert 'id="first-login"' not in httpx.get(base + "/admin/login").text  # someone is in now
        # Log records reach the file through the logging queue's thread: on a loaded machine later.
        wait_for(lambda: str(password_file) in log.read_text(), within=30, what="the start-up lines in the log")
    finally:
        proc.terminate()
        proc.wait(10)
    key = (tmp_path / "demo-api-key").read_text().strip()
    text = log.read_text()
    assert key not in text and password not in text, text
    assert str(tmp_path / "demo-api-key") in text and str(password_file) in text


def test_with_no_admin_at_all_the_login_page_says_how_to_make_one(tmp_path: Path) -> None:
    gw = start_gateway(tmp_path, seed_with={"models": {"sim": sim_model("sim")}})  # no demo bootstrap, no admin
    try:
        page = httpx.get(gw.base_url + "/admin/login").text
        assert 'id="first-login"' in page and "laneway admin create" in page
    finally:
        gw.stop()


def test_cli_refusals_are_one_line_with_status_1_and_usage_errors_status_2(cli) -> None:  # type: ignore[no-untyped-def]
    cli("tenant", "create", "acme")
    env = {**cli.env, "LANEWAY_NEW_ADMIN_PASSWORD": "a-long-enough-password"}
    cases = [
        (["tenant", "create", "acme"], "laneway: A tenant named 'acme' exists.", cli.env),
        (["admin", "create", "root"], None, env),
        (["admin", "create", "root"], "laneway: An admin named 'root' exists.", env),
        (
            ["admin", "create", "short"],
            "laneway: An admin password needs at least 10 characters.",
            {**cli.env, "LANEWAY_NEW_ADMIN_PASSWORD": "short"},
        ),
        (["key", "revoke", "999"], "laneway: No api_key with id 999.", cli.env),
        (["model", "set", "m", "--engine", "sim", "--config", "{nope"], "laneway: --config is not JSON", cli.env),
    ]
    for args, said, run_env in cases:
        out = subprocess.run([EXE, *args], env=run_env, capture_output=True, text=True, timeout=60)
        if said is None:
            assert out.returncode == 0, out.stderr
            continue
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.strip().startswith(said) and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert "Traceback" not in out.stderr
    usage = cli("tenant", "create", check=False)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_cli_changes_are_audited_as_the_cli_user(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import getpass
    import sqlite3

    cli("tenant", "create", "audited", "--rpm", "7")
    key_id = cli("key", "issue", "audited").stderr.split()[2]
    cli("key", "revoke", key_id)
    cli("model", "set", "m", "--engine", "sim")
    with sqlite3.connect(tmp_path / "laneway.db") as db:
        rows = db.execute("SELECT actor, action, entity FROM audit_log ORDER BY id").fetchall()
    actor = f"cli:{getpass.getuser()}"
    assert rows == [
        (actor, "create", "tenant"),
        (actor, "issue", "api_key"),
        (actor, "revoke", "api_key"),
        (actor, "create", "model"),
    ]


def test_a_cli_change_reaches_a_running_replica_through_notify(cli, pg_database: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The gateway polls once an hour here: only the CLI's NOTIFY can bring the new model in time."""
    replica = start_gateway(
        tmp_path / "replica",
        database_url=pg_database,
        policy_poll_interval_s=3600,
        seed_with={"models": {"old": sim_model("old")}, "tenants": {"acme": {}}},
    )
    try:
        wait_for(lambda: replica.server.runtime.config_changes.connected, what="the replica's LISTEN")
        env = {**cli.env, "LANEWAY_DATABASE_URL": pg_database}
        subprocess.run(
            [EXE, "model", "set", "fresh", "--engine", "sim", "--config", '{"max_concurrency": 2}'],
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(lambda: "fresh" in replica.gateway.registry.aliases(), within=10, what="the model set by the CLI")
        client = openai.OpenAI(base_url=replica.api_url, api_key=replica.keys["acme"], max_retries=0)
        assert (
            client.chat.completions.create(model="fresh", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
            .choices[0]
            .message.content
        )
    finally:
        replica.stop()


def test_cli_sets_quotas_and_key_limits_through_the_admin_service(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import getpass
    import sqlite3

    def tenant_row() -> tuple[object, ...]:
        with sqlite3.connect(tmp_path / "laneway.db") as db:
            return tuple(
                db.execute(
                    "SELECT rpm, tpm, max_concurrency, tokens_per_day, tokens_per_month FROM tenants WHERE name = 'q'"
                ).fetchone()
            )

    def key_row(key_id: str) -> tuple[object, ...]:
        with sqlite3.connect(tmp_path / "laneway.db") as db:
            rpm, tpm, maxc, models = db.execute(
                "SELECT rpm, tpm, max_concurrency, allowed_models FROM api_keys WHERE id = ?", (key_id,)
            ).fetchone()
        return rpm, tpm, maxc, models and json.loads(models)

    cli("tenant", "create", "q", "--rpm", "100", "--daily-tokens", "5000", "--monthly-tokens", "3000000000")
    assert tenant_row() == (100, None, None, 5000, 3_000_000_000)
    out = cli("tenant", "set", "q", "--daily-tokens", "none", "--tpm", "900", "--max-concurrency", "4")
    assert out.stdout.strip() == "updated tenant q: tpm 900, max_concurrency 4, tokens_per_day unlimited"
    assert tenant_row() == (100, 900, 4, None, 3_000_000_000)  # what was not named is kept

    issued = cli("key", "issue", "q", "--name", "narrow", "--rpm", "10", "--models", "sim, other")
    key_id = issued.stderr.split()[2]
    assert issued.stdout.startswith("lw-") and key_row(key_id) == (10, None, None, ["sim", "other"])
    out = cli("key", "set", key_id, "--rpm", "none", "--tpm", "500", "--max-concurrency", "2", "--models", "all")
    assert out.stdout.startswith(f"updated key {key_id} (lw-") and "rpm the tenant's, tpm 500" in out.stdout
    assert key_row(key_id) == (None, 500, 2, None)

    with sqlite3.connect(tmp_path / "laneway.db") as db:
        rows = db.execute("SELECT actor, action, entity, after FROM audit_log ORDER BY id").fetchall()
    actor = f"cli:{getpass.getuser()}"
    assert [r[:3] for r in rows] == [
        (actor, "create", "tenant"),
        (actor, "update", "tenant"),
        (actor, "issue", "api_key"),
        (actor, "update", "api_key"),
    ]
    assert json.loads(rows[1][3])["tokens_per_day"] is None and json.loads(rows[3][3])["tpm"] == 500


def test_cli_limit_refusals_are_one_line_and_change_nothing(cli) -> None:  # type: ignore[no-untyped-def]
    cli("tenant", "create", "q", "--rpm", "100")
    key_id = cli("key", "issue", "q").stderr.split()[2]
    cases = [
        (["tenant", "set", "q", "--daily-tokens", "0"], "laneway: tokens_per_day must be a whole number of tokens"),
        (["tenant", "set", "q", "--monthly-tokens", "lots"], "laneway: tokens_per_month must be a whole number"),
        (["tenant", "set", "q", "--rpm", "-3"], "laneway: rpm must be a whole number, at least 1"),
        (["tenant", "create", "r", "--daily-tokens", "12.5"], "laneway: tokens_per_day must be a whole number"),
        (["tenant", "set", "nobody", "--rpm", "5"], "laneway: no tenant named 'nobody'"),
        (["key", "set", key_id, "--rpm", "101"], "laneway: rpm 101 is above tenant 'q''s RPM of 100"),
        (["key", "issue", "q", "--max-concurrency", "0"], "laneway: max_concurrency must be a whole number"),
        (["key", "set", "999", "--rpm", "5"], "laneway: No api_key with id 999."),
    ]
    for args, said in cases:
        out = cli(*args, check=False)
        assert out.returncode == 1, (args, out.stderr)
        assert out.stderr.startswith(said) and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
        assert out.stdout == "" and "Traceback" not in out.stderr
    for args in (["tenant", "set", "q"], ["key", "set", key_id], ["key", "set", "first", "--rpm", "1"]):
        usage = cli(*args, check=False)  # nothing to change, or not a key id: usage errors
        assert usage.returncode == 2 and "usage:" in usage.stderr and "Traceback" not in usage.stderr, args
    assert cli("tenant", "create", "r", check=False).returncode == 0  # the refused create made nothing


def test_a_quota_set_by_the_cli_is_enforced_by_a_running_replica(cli, pg_database: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    replica = start_gateway(
        tmp_path / "replica",
        database_url=pg_database,
        policy_poll_interval_s=3600,
        seed_with={"models": {"sim": sim_model("sim")}, "tenants": {"acme": {}}},
    )
    client = openai.OpenAI(base_url=replica.api_url, api_key=replica.keys["acme"], max_retries=0)

    def complete() -> int:
        return client.completions.create(model="sim", prompt="hi", max_tokens=9).usage.total_tokens  # type: ignore[union-attr]

    try:
        wait_for(lambda: replica.server.runtime.config_changes.connected, what="the replica's LISTEN")
        used = complete()  # counted before any quota: a quota applies to the day's use
        env = {**cli.env, "LANEWAY_DATABASE_URL": pg_database}
        quota = 3 * used
        subprocess.run(
            [EXE, "tenant", "set", "acme", "--daily-tokens", str(quota)],
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(
            lambda: replica.server.runtime.config_changes.received >= 1,
            within=10,
            what="the replica hearing of the CLI's change",
        )
        used += complete() + complete()  # exactly the quota
        with pytest.raises(openai.RateLimitError) as info:
            complete()
        error = info.value.response.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert f"used {used} of its daily quota of {quota} tokens" in error["message"]
        subprocess.run(
            [EXE, "tenant", "set", "acme", "--daily-tokens", "none"],
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
        wait_for(lambda: replica.server.runtime.config_changes.received >= 2, within=10, what="the second change")
        assert complete() == used // 3  # no quota any more
    finally:
        replica.stop()
