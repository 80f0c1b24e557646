"""The built wheel runs on its own: installed (not editable) into a fresh venv, `laneway serve`
started from a directory that is not the repository migrates a fresh SQLite database, serves
a chat completion with the tiny demo model and renders the admin login page, with the
migrations, templates, htmx and default policies all read from the installed package. Those
live at the top of the repository (admin-ui/, migrations/, policies/): the wheel carries them
as real files under laneway/, and so does a wheel built from the sdist. An editable install,
in a fresh venv too, reads them from the top-level folders through the links in
platform/laneway/ (docs/decisions/0005-top-level-data.md).

A fresh venv gets laneway from the wheel and nothing else of it. Its dependencies (some
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
import stat
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from contextlib import closing
from pathlib import Path

import httpx
import openai
import pytest
from alembic.script import ScriptDirectory
from laneway.db.migrate import alembic_config
from support import serve, unavailable

ROOT = Path(__file__).resolve().parents[2]
# The top-level folder and where the wheel puts it.
PACKAGE_DATA = {"admin-ui": "laneway/admin_ui", "migrations": "laneway/migrations", "policies": "laneway/policies"}


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


def _hatchling(tmp: Path, call: str, cwd: Path) -> Path:
    """Build with hatchling's own API in this interpreter (`call`: build_sdist, build_editable or
    build_wheel), as a frontend without build isolation does; the artefact built."""
    if importlib.util.find_spec("hatchling") is None:
        _skip_or_fail("hatchling (a dev dependency) is not installed: cannot build offline")
    code = f"import sys; from hatchling.build import {call}; print({call}(sys.argv[1]))"
    built = subprocess.run([sys.executable, "-c", code, str(tmp)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-4000:]
    return tmp / built.stdout.strip().splitlines()[-1]


def _fresh_venv(venv: Path, wheel: Path) -> Path:
    """A venv holding `wheel` (installed first, so pip sees no other laneway), with this
    interpreter's site-packages after its own for the dependencies."""
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
    return venv


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fresh_venv(tmp_path_factory.mktemp("venv"), wheel)


def _source_files(top: str) -> set[str]:
    """The files of a top-level folder, as the wheel names them."""
    return {
        f"{PACKAGE_DATA[top]}/{p.relative_to(ROOT / top).as_posix()}"
        for p in (ROOT / top).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def _wheel_files(wheel: Path) -> dict[str, zipfile.ZipInfo]:
    with zipfile.ZipFile(wheel) as archive:
        infos = archive.infolist()
    names = [i.filename for i in infos]
    assert len(names) == len(set(names)), "the wheel names a file twice"
    return {i.filename: i for i in infos}


def test_the_wheel_carries_the_top_level_folders_as_real_files(wheel: Path) -> None:
    files = _wheel_files(wheel)
    for top, packaged in PACKAGE_DATA.items():
        expected = _source_files(top)
        assert expected, f"{top}/ is empty"
        shipped = {name for name in files if name.startswith(f"{packaged}/")}
        assert shipped == expected, (top, shipped ^ expected)
        for name in shipped:  # a link in a wheel would point nowhere once installed
            assert not stat.S_ISLNK(files[name].external_attr >> 16), name
            assert files[name].file_size > 0, name
    assert not [name for name in files if name.startswith(("platform/", "admin-ui/"))], sorted(files)


def test_a_wheel_built_from_the_sdist_carries_them_too(wheel: Path, tmp_path: Path) -> None:
    # Frontends such as `python -m build` and uv build the wheel from the sdist, where the links
    # are not (they are left out): the wheel must come out the same.
    sdist = _hatchling(tmp_path, "build_sdist", ROOT)
    with tarfile.open(sdist) as archive:
        assert not [m.name for m in archive.getmembers() if m.issym() or m.islnk()]
        # The "data" filter (3.11.4+) refuses links and paths out of the folder; older 3.11 has none.
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        archive.extractall(tmp_path / "unpacked", **safe)
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    for top in PACKAGE_DATA:
        assert (unpacked / top).is_dir(), f"the sdist lacks {top}/"
    (tmp_path / "out").mkdir()
    rebuilt = _hatchling(tmp_path / "out", "build_wheel", unpacked)
    assert set(_wheel_files(rebuilt)) == set(_wheel_files(wheel))


@pytest.fixture(scope="module")
def editable_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The editable wheel pip would build and install for `pip install -e .` (PEP 660).
    editable = _hatchling(tmp_path_factory.mktemp("editable"), "build_editable", ROOT)
    with zipfile.ZipFile(editable) as archive:
        # One .pth putting platform/ on sys.path, and no copy of the data to go stale.
        assert [n for n in archive.namelist() if not n.startswith("laneway-")] == ["_laneway.pth"]
        assert Path(archive.read("_laneway.pth").decode().strip()).resolve() == ROOT / "platform"
    return _fresh_venv(tmp_path_factory.mktemp("editable-venv"), editable)


def test_an_editable_install_reads_the_top_level_folders(editable_venv: Path, tmp_path: Path) -> None:
    venv = editable_venv
    probe = (
        "import json, laneway, laneway.resources as r, jinja2\n"
        "from laneway.bootstrap import POLICIES_DIR\n"
        "t = jinja2.Environment(loader=jinja2.FileSystemLoader(r.package_dir(r.ADMIN_TEMPLATES)))\n"
        "t.get_template('login.html')\n"
        "print(json.dumps({'file': laneway.__file__, 'migrations': str(r.package_dir(r.MIGRATIONS)),"
        " 'templates': str(r.package_dir(r.ADMIN_TEMPLATES)), 'static': str(r.package_dir(r.ADMIN_STATIC)),"
        " 'policies': str(r.package_dir(r.POLICIES)), 'lanes': (POLICIES_DIR / 'lanes.yaml').read_text()}))"
    )
    run = {"env": _clean_env(venv), "cwd": tmp_path, "capture_output": True, "text": True, "timeout": 120}
    seen = json.loads(subprocess.run([venv / "bin" / "python", "-c", probe], check=True, **run).stdout)
    assert Path(seen["file"]).resolve() == ROOT / "platform" / "laneway" / "__init__.py"
    assert Path(seen["migrations"]) == ROOT / "migrations"
    assert Path(seen["templates"]) == ROOT / "admin-ui" / "templates"
    assert Path(seen["static"]) == ROOT / "admin-ui" / "static"
    assert Path(seen["policies"]) == ROOT / "policies"
    assert seen["lanes"] == (ROOT / "policies" / "lanes.yaml").read_text()

    # The commands that read them: `migrate` (Alembic's env and versions) and `import-policies`
    # (the default YAML), on the default SQLite database in ./laneway-data.
    migrated = subprocess.run([venv / "bin" / "laneway", "migrate"], **run)
    assert migrated.returncode == 0, migrated.stderr[-4000:]
    imported = subprocess.run([venv / "bin" / "laneway", "import-policies"], **run)
    assert imported.returncode == 0, imported.stderr[-4000:]
    with closing(sqlite3.connect(tmp_path / "laneway-data" / "laneway.db")) as conn:
        (revision,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        lanes = {name for (name,) in conn.execute("SELECT name FROM lanes")}
    assert revision == ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()
    assert {"batch", "interactive", "standard"} <= lanes, lanes


def test_the_wheel_is_the_only_laneway_in_the_venv(venv: Path, tmp_path: Path) -> None:
    probe = (
        "import json, sys, laneway, laneway.resources as r\n"
        "print(json.dumps({'file': laneway.__file__, 'path': sys.path,"
        " 'migrations': str(r.package_dir(r.MIGRATIONS)), 'templates': str(r.package_dir(r.ADMIN_TEMPLATES)),"
        " 'static': str(r.package_dir(r.ADMIN_STATIC)), 'policies': str(r.package_dir(r.POLICIES))}))"
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
    for what in ("file", "migrations", "templates", "static", "policies"):
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
    env = {**_clean_env(venv), "LANEWAY_METRICS_TOKEN": "wheel-token"}  # /health/ready's details need it
    proc, port = serve(env, log=log, exe=str(venv / "bin" / "laneway"), cwd=elsewhere)
    base = f"http://127.0.0.1:{port}"
    try:
        ready = httpx.get(f"{base}/health/ready", headers={"Authorization": "Bearer wheel-token"}).json()
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
        packaged = next(venv.glob("lib/python*/site-packages/laneway/admin_ui/static/htmx.min.js"))
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
