"""The built wheel runs on its own: installed (not editable) into a fresh venv, `laneway serve`
started from a directory that is not the repository migrates a fresh SQLite database, serves
a chat completion with the tiny demo model and renders the admin login page, with the
migrations, templates, htmx and default policies all read from the installed package.

The fresh venv gets laneway from the wheel and nothing else of it. Its dependencies (some
compiled for minutes, like llama-cpp-python) come from this interpreter's site-packages through
a .pth file that names that directory: a directory named in a .pth is appended to sys.path,
but the .pth files inside it are not run, so the editable install's hook (a .pth putting the
source tree on sys.path, or an import finder) never activates, and the venv's own
site-packages, holding the wheel, comes first. The test asserts where laneway was imported
from instead of trusting this."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import site
import sqlite3
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import httpx
import openai
import pytest
from alembic.script import ScriptDirectory
from laneway.db.migrate import alembic_config
from support import serve, unavailable

ROOT = Path(__file__).resolve().parents[2]


def _skip_or_fail(reason: str) -> None:
    unavailable(reason, f"{reason} (CI=true: the packaging test must run)")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # hatchling (a dev dependency) here: no isolated build env, so no index is needed and it takes seconds.
    # Without it, pip fetches hatchling into an isolated build env from the index.
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("hatchling") else []
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "--wheel-dir", str(out), str(ROOT)]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    wheels = list(out.glob("laneway-*.whl"))
    if built.returncode != 0 or len(wheels) != 1:
        _skip_or_fail(f"could not build the wheel: {built.stderr.strip()[-2000:] or built.stdout[-2000:]}")
    return wheels[0]


def _clean_env(venv: Path) -> dict[str, str]:
    """This environment without what would point Python at the source tree (PYTHONPATH) or
    configure laneway from outside the test."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "LANEWAY_")) and k != "VIRTUAL_ENV"}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # This interpreter's pip installs into the new venv (pip --python): no pip copy to bootstrap.
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        env=_clean_env(venv),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = sysconfig.get_paths()
    deps = dict.fromkeys([ours["purelib"], ours["platlib"]])  # a directory, its .pth files not run
    (Path(site) / "zz_laneway_test_dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    yield venv


def test_the_wheel_is_the_only_laneway_in_the_venv(venv: Path, tmp_path: Path) -> None:
    probe = (
        "import json, sys, laneway, laneway.resources as r\n"
        "print(json.dumps({'file': laneway.__file__, 'path': sys.path,"
        " 'migrations': str(r.package_dir(r.MIGRATIONS)), 'templates': str(r.package_dir(r.ADMIN_TEMPLATES))}))"
    )
    seen = json.loads(
        subprocess.run(
            [venv / "bin" / "python", "-c", probe],
            env=_clean_env(venv),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout
    )
    for what in ("file", "migrations", "templates"):
        assert Path(seen[what]).resolve().is_relative_to(venv.resolve()), (what, seen[what])
    # The dependencies come from this interpreter's site-packages, which may lie in the checkout
    # (.venv); nothing else of the repository may be on the path.
    deps = {Path(p).resolve() for p in site.getsitepackages()}
    source = [p for p in seen["path"] if p and Path(p).resolve() not in deps and Path(p).resolve().is_relative_to(ROOT)]
    assert not source, seen["path"]


def test_the_installed_wheel_serves_from_any_directory(venv: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"  # not the repository: nothing can be found relative to it
    elsewhere.mkdir()
    log = tmp_path / "serve.log"
    proc, port = serve(_clean_env(venv), log=log, exe=str(venv / "bin" / "laneway"), cwd=elsewhere)
    base = f"http://127.0.0.1:{port}"
    try:
        ready = httpx.get(f"{base}/health/ready").json()
        assert ready["models"] == ["tiny"] and ready["failed"] == {}, ready

        # `serve` migrated a fresh database, in ./laneway-data of its working directory, to the head.
        db = elsewhere / "laneway-data" / "laneway.db"
        with closing(sqlite3.connect(db)) as conn:
            (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            lanes = {name for (name,) in conn.execute("SELECT name FROM lanes")}  # the packaged policies
        assert revision == ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
        assert {"batch", "interactive", "standard"} <= lanes, lanes

        key = (elsewhere / "laneway-data" / "demo-api-key").read_text().strip()
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        answer = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hello"}], max_tokens=8, temperature=0
        )
        assert answer.choices[0].message.content and answer.usage and answer.usage.completion_tokens > 0

        login = httpx.get(f"{base}/admin/login")
        assert login.status_code == 200 and "<form" in login.text, login.text[:500]
        assert "/admin/static/htmx.min.js" in login.text
        packaged = next(venv.glob("lib/python*/site-packages/laneway/admin/static/htmx.min.js"))
        htmx = httpx.get(f"{base}/admin/static/htmx.min.js")
        assert htmx.status_code == 200 and htmx.content == packaged.read_bytes()
        assert httpx.get(f"{base}/admin/static/admin.css").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-4000:]
