"""Admin passwords (argon2id) and session tokens (random; only their sha256 is stored)."""

from __future__ import annotations

import hashlib
import secrets

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

_hasher = PasswordHasher()
# Verified when the username is unknown, so a wrong name costs as long as a wrong password.
_DUMMY_HASH = _hasher.hash("laneway-dummy-password")


def hash_password(password: str) -> str:
    if len(password) < 10:
        raise ValueError("admin passwords must have at least 10 characters")
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def new_session_token() -> tuple[str, str, str]:
    """(cookie secret, its sha256, the CSRF token bound to the session)."""
    token = secrets.token_urlsafe(32)
    return token, hashlib.sha256(token.encode()).hexdigest(), secrets.token_urlsafe(24)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
