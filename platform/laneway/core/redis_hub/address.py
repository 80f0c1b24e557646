"""Where the hub's own connection goes: a Redis URL read into host, port (or a Unix socket),
credentials, database and TLS, as redis-py reads the same URL for its client.

Only what changes *which* server and database is reached is read here; a query option this
pipe does not apply is refused at start-up rather than silently ignored.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

_CERT_REQS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
_TLS_OPTIONS = {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}


@dataclass(frozen=True, slots=True)
class RedisAddress:
    host: str = "localhost"
    port: int = 6379
    unix_path: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0
    tls: ssl.SSLContext | None = None

    @property
    def where(self) -> str:
        return self.unix_path or f"{self.host}:{self.port}"

    def handshake(self) -> list[list[str]]:
        """The commands a new connection sends before any call: AUTH, SELECT."""
        commands: list[list[str]] = []
        if self.password is not None:
            commands.append(["AUTH", self.username, self.password] if self.username else ["AUTH", self.password])
        if self.db:
            commands.append(["SELECT", str(self.db)])
        return commands


def parse_redis_url(url: str) -> RedisAddress:
    """redis://[[user]:password@]host[:port][/db], rediss://... (TLS), unix://[[user]:password@]/path[?db=n]."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"a Redis URL starts with redis://, rediss:// or unix://, not {url!r}")
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - _TLS_OPTIONS - {"db"}
    if unknown:
        raise ValueError(f"Redis URL options not supported: {', '.join(sorted(unknown))}")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    path = unquote(parts.path)
    if parts.scheme == "unix":
        return RedisAddress(unix_path=path, username=username, password=password, db=int(options.get("db", 0)))
    db = options.get("db") or path.lstrip("/") or "0"
    tls = _tls_context(options) if parts.scheme == "rediss" else None
    return RedisAddress(parts.hostname or "localhost", parts.port or 6379, None, username, password, int(db), tls)


def _tls_context(options: dict[str, str]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    reqs = _CERT_REQS.get(options.get("ssl_cert_reqs", "required").lower())
    if reqs is None:
        raise ValueError(f"ssl_cert_reqs must be none, optional or required, not {options['ssl_cert_reqs']!r}")
    check_hostname = options.get("ssl_check_hostname", "true" if reqs != ssl.CERT_NONE else "false")
    context.check_hostname = check_hostname.lower() in ("1", "true", "yes")
    context.verify_mode = reqs
    if "ssl_certfile" in options:
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context
