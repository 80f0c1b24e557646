"""Names people sign in with or tell apart: account names plain enough that two cannot look alike.

An account name (an admin's, a portal user's) is ASCII letters, digits and `. _ - @ +`: a
Cyrillic a (U+0430) in "admin" or a fullwidth "admin" (U+FF41...) would read as another account's name in the
audit log and the user lists. A display name (a key's) may be any script, but not one that
Unicode's NFKC folds into other characters (fullwidth forms, ligatures), nor one with invisible
format characters (zero-width spaces, bidi overrides) that make two names look alike."""

from __future__ import annotations

import re
import unicodedata

from laneway.admin.validation import check_text
from laneway.contracts.codes import ErrorCode
from laneway.contracts.errors import GatewayError

MAX_ACCOUNT_NAME = 120
_ACCOUNT = re.compile(r"[A-Za-z0-9._@+-]+\Z")


def check_account_name(param: str, value: str) -> str:
    check_text(param, value, max_length=MAX_ACCOUNT_NAME)
    if not _ACCOUNT.match(value):
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{param} may use only ASCII letters, digits and . _ - @ + (no spaces, no look-alike letters "
            "from other scripts).",
            param=param,
        )
    return value


def check_display_name(param: str, value: str, *, max_length: int = 120) -> str:
    check_text(param, value, max_length=max_length)
    if unicodedata.normalize("NFKC", value) != value:
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{param} has characters that stand for others (fullwidth letters, ligatures and the like); "
            "type them plainly.",
            param=param,
        )
    if any(unicodedata.category(ch) in ("Cf", "Co", "Cs", "Zl", "Zp") for ch in value):
        raise GatewayError(
            ErrorCode.INVALID_REQUEST,
            f"{param} has invisible formatting characters (such as zero-width spaces or direction marks).",
            param=param,
        )
    return value
