"""A lane capping a deployment below its engine's own sequence limit is said, not silent:
logged at start (naming the setting), shown on the admin Models and Lanes pages, and gone
from both when the lane is raised."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
from support import sim_model, start_gateway

PASSWORD = "correct horse battery"
LANES = [
    {"name": "interactive", "priority": 0, "match_stream": True, "max_concurrency": 4},
    {"name": "standard", "priority": 1, "max_concurrency": 16},
]
LINE = "lane 'interactive' runs at most 4 of the 8 sequences deployment 'chat-sim' (chat) takes"


def _csrf(html: str) -> str:
    return html.split('name="csrf_token" value="')[1].split('"')[0]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_a_lane_below_the_engines_sequences_is_logged_at_start_and_shown_until_raised(tmp_path: Path) -> None:
    seed = {"models": {"chat": sim_model("chat", max_concurrency=8)}, "lanes": LANES, "tenants": {"acme": {}}}
    logged = Lines()  # on the logger itself: the app's logging setup replaces the root's handlers
    logging.getLogger("laneway.policy").addHandler(logged)
    gw = start_gateway(tmp_path, seed_with=seed, admin_password=PASSWORD, policy_poll_interval_s=0.05)
    try:
        (line,) = [x for x in logged.lines if LINE in x]
        assert "raise the lane's max_concurrency" in line  # the setting to change
        browser = httpx.Client(base_url=gw.base_url)
        form = {"csrf_token": _csrf(browser.get("/admin/login").text), "username": "admin", "password": PASSWORD}
        assert browser.post("/admin/login", data=form).status_code == 303
        models, lanes = browser.get("/admin/models").text, browser.get("/admin/policies").text
        assert "Lanes capped below this engine's\n    8 sequences: interactive 4" in models
        assert re.search(
            r"<strong>chat-sim</strong> \(chat\):\s+its engine runs 8 sequences; this lane runs at most 4 "
            r"of them at once,\s+leaving 4 unused",
            lanes,
        )
        assert lanes.count('class="notice lane-caps"') == 1  # standard (16) caps nothing

        admin = httpx.Client(base_url=gw.base_url + "/admin/api")
        login = admin.post("/login", json={"username": "admin", "password": PASSWORD}).json()
        admin.headers["X-CSRF-Token"] = login["csrf_token"]
        assert admin.put("/lanes/interactive", json={"max_concurrency": 8}).status_code == 200
        assert 'class="notice lane-caps"' not in browser.get("/admin/policies").text  # the edit applies at once
        assert "Lanes capped below" not in browser.get("/admin/models").text
    finally:
        gw.stop()
        logging.getLogger("laneway.policy").removeHandler(logged)
