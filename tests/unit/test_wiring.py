"""How the app is wired, checked on the built app: handlers get services through dependency
injection (nothing reads `app.state`), the /v1 hot path resolves one dependency, and every
admin route but the login ones is behind the session guard, every admin change behind a
CSRF guard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from laneway.admin.guards import SESSION_OPT, AdminGuards, csrf_form, csrf_header
from laneway.app import create_app
from laneway.settings import Settings
from litestar import Litestar
from litestar.handlers import HTTPRouteHandler

PACKAGE = Path(__file__).resolve().parents[2] / "platform" / "laneway"
PUBLIC_ADMIN = {("/admin/api/login", "POST"), ("/admin/login", "GET"), ("/admin/login", "POST")}
OPTIONAL_ADMIN = {("/admin", "GET"), ("/admin/logout", "POST")}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Litestar:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("wiring"), bootstrap_demo=False))


def handlers(app: Litestar) -> list[tuple[str, str, HTTPRouteHandler]]:
    out = []
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            if isinstance(handler, HTTPRouteHandler):
                # Litestar's own OPTIONS handlers (the Allow header) run nothing of ours.
                out += [(route.path, method, handler) for method in handler.http_methods if method != "OPTIONS"]
    return out


def test_no_module_reads_app_state() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bapp\.state\b|litestar\.datastructures import State\b", line)
    ]
    assert offenders == [], "services come through Provide (runtime.py), not app.state:\n" + "\n".join(offenders)


def test_the_v1_handlers_resolve_one_dependency(app: Litestar) -> None:
    v1 = [(path, h) for path, _, h in handlers(app) if path.startswith("/v1")]
    assert len(v1) >= 6  # models, a model, chat, completions, embeddings, responses
    for path, handler in v1:
        provided = set(handler.resolve_dependencies())
        declared = set(handler.parsed_fn_signature.parameters) & provided
        # The generation routes take `api`; the Files and Batches routes `batch_api`.
        assert declared in ({"api"}, {"batch_api"}), f"{path} declares {declared}: one pre-built object is cheap"


def _is_session_guard(guard: Any) -> bool:
    return getattr(guard, "__func__", None) is AdminGuards.session


def test_admin_routes_are_guarded(app: Litestar) -> None:
    seen: set[tuple[str, str]] = set()
    for path, method, handler in handlers(app):
        if not path.startswith("/admin") or path.startswith("/admin/static"):
            continue
        key = (path, method)
        seen.add(key)
        guards = handler.resolve_guards()
        assert any(_is_session_guard(g) for g in guards), f"{method} {path} has no session guard"
        mode = handler.opt.get(SESSION_OPT, "required")
        expected = "none" if key in PUBLIC_ADMIN else "optional" if key in OPTIONAL_ADMIN else "required"
        assert mode == expected, f"{method} {path} is {mode}, expected {expected}"
        csrf = csrf_header if path.startswith("/admin/api") else csrf_form
        assert csrf in guards, f"{method} {path}: changes need the CSRF guard"
    assert PUBLIC_ADMIN | OPTIONAL_ADMIN <= seen
    assert len(seen) > 30  # the API, the pages, the usage pages


def test_each_fast_route_shadows_a_v1_handler(app: Litestar) -> None:
    """api/fast.py serves these below Litestar: each must still be a route of the app (the
    OpenAPI document and Litestar-served apps answer it) taking the one `api` dependency."""
    from laneway.api.registry import fast_routes

    posts = {path: h for path, method, h in handlers(app) if method == "POST"}
    assert set(fast_routes()) == {"/v1/chat/completions", "/v1/completions", "/v1/messages"}
    for path in fast_routes():
        assert path in posts, f"{path} is served by api/fast.py but is no route of the app"
        declared = set(posts[path].parsed_fn_signature.parameters) & set(posts[path].resolve_dependencies())
        assert declared == {"api"}
