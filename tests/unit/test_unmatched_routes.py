"""The bounded path label of an unmatched route's refusal (api/errors.py)."""

from __future__ import annotations

import pytest
from laneway.api.errors import unmatched_path


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/files", "/v1/files"),
        ("/v1/files/file-abc/content", "/v1/files"),
        ("/v1/chat/nope", "/v1/chat"),
        ("/v1/fine_tuning/jobs", "/v1/fine_tuning"),
        ("/v1/anything-a-scanner-tries", "/v1/other"),
        ("/v1", "/v1/other"),
        ("/v1x/files", "other"),
        ("/wp-login.php", "other"),
        ("/", "other"),
    ],
)
def test_an_unmatched_path_is_a_bounded_label(path: str, label: str) -> None:
    assert unmatched_path(path) == label
