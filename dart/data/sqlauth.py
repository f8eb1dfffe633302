"""Who a SQL endpoint request comes from: ClickHouse-style credentials, the writer role's PBKDF2
hash, and the throttle that bounds password guessing (``dart.data.http`` runs the checks on a
worker thread, never on the event loop)."""

from __future__ import annotations

import base64
import collections
import hashlib
import hmac
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dart.errors import ConfigError, DartError


class Unauthorized(DartError, PermissionError):
    """Credentials that name no role, or a wrong password (answered with 401)."""


HASH_SCHEME = "pbkdf2_sha256"
HASH_ITERATIONS = 20_000
"""PBKDF2 rounds for a writer password hashed at start-up (checked on every writer request, so
few: the endpoint is on loopback, the hash only keeps the password itself out of the process and
its files)."""


def hash_password(password: str, *, iterations: int = HASH_ITERATIONS, salt: bytes | None = None) -> str:
    """``pbkdf2_sha256$ITERATIONS$SALT_HEX$HASH_HEX``: what a writer password file may hold instead
    of the password (``python -c 'from dart.data.http import hash_password; print(hash_password("..."))'``)."""
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"), salt, iterations)
    return f"{HASH_SCHEME}${iterations}${salt.hex()}${digest.hex()}"


@dataclass(frozen=True, slots=True)
class Writer:
    """The writer role: its user and a PBKDF2 hash of its password (never the password)."""

    user: str
    password_hash: str = field(repr=False)

    def __post_init__(self) -> None:
        scheme, iterations, salt, digest = [*self.password_hash.split("$"), "", "", ""][:4]
        if scheme != HASH_SCHEME or not iterations.isdigit() or not salt or not digest:
            raise ConfigError(f"writer password hash: expected {HASH_SCHEME}$ITERATIONS$SALT_HEX$HASH_HEX")

    @classmethod
    def from_secret(cls, user: str, secret: str) -> Writer:
        """From a password file's text: a hash as written by ``hash_password``, or the password
        itself (hashed here; the caller drops the text)."""
        secret = secret.strip()
        return cls(user, secret if secret.startswith(HASH_SCHEME + "$") else hash_password(secret))

    @classmethod
    def from_file(cls, user: str, path: str | Path) -> Writer:
        try:
            return cls.from_secret(user, Path(path).read_text())
        except OSError as exc:
            raise ConfigError(f"writer password file {path}: {exc}") from exc

    def check(self, password: str) -> bool:
        _, iterations, salt, digest = self.password_hash.split("$")
        got = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8", "surrogateescape"), bytes.fromhex(salt),
                                  int(iterations))
        return hmac.compare_digest(got.hex(), digest)


def writer_from_env(user: str, file_env: str = "DART_SQL_WRITER_PASSWORD_FILE",
                    environ: Mapping[str, str] | None = None) -> Writer | None:
    """The writer role as the data manager starts it: ``$<file_env>`` names the password file
    (Docker secrets' ``*_FILE`` convention); None when unset (no writer). A password in the
    environment itself (``DART_SQL_WRITER_PASSWORD``, as before) is refused: the environment
    of a process stays readable in ``/proc/<pid>/environ`` for its whole life."""
    env = os.environ if environ is None else environ
    if env.get("DART_SQL_WRITER_PASSWORD"):
        raise ConfigError("DART_SQL_WRITER_PASSWORD is no longer read: put the password (or "
                          f"dart.data.http.hash_password's hash of it) in a file and name it in ${file_env}")
    path = env.get(file_env)
    return Writer.from_file(user, path) if path else None


def credentials(headers: Mapping[str, str], query: Mapping[str, str]) -> tuple[str | None, str]:
    """(user, password) the way a ClickHouse client may send them: ``Authorization: Basic``,
    ``X-ClickHouse-User`` / ``X-ClickHouse-Key`` headers, or ``user`` / ``password`` parameters."""
    auth = headers.get("Authorization", "")
    if auth[:6].lower() == "basic ":
        try:
            user, _, password = base64.b64decode(auth[6:].strip(), validate=True).decode("utf-8").partition(":")
        except ValueError as exc:  # binascii.Error, UnicodeDecodeError, non-ASCII text
            raise Unauthorized(f"unreadable Authorization header: {exc}") from exc
        return user, password
    if "X-ClickHouse-User" in headers:
        return headers["X-ClickHouse-User"], headers.get("X-ClickHouse-Key", "")
    return query.get("user"), query.get("password", "")


def role_of(user: str | None, password: str, writer: Writer | None) -> bool:
    """True for the writer, False for an analytics client; Unauthorized for anyone else.

    ``default`` (or no user) is the analytics role and needs no password: the endpoint is on
    loopback and that role cannot change anything."""
    if user in (None, "", "default"):
        return False
    if writer is not None and user == writer.user:
        if writer.check(password):
            return True
        raise Unauthorized(f"{user}: wrong password")
    raise Unauthorized(f"unknown user {user!r}: use 'default' (read-only) or the writer user")


class LoginThrottle:
    """Failed writer logins per client: after ``max_failures`` within ``window_s`` (checks still
    running count as failures until they end), a client's next logins are refused unchecked until
    the oldest failure leaves the window. A password check costs PBKDF2's rounds of CPU: unbounded,
    guessing would be both a brute force and a way to take the endpoint's CPU."""

    def __init__(self, max_failures: int, window_s: float, *, max_clients: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_failures, self.window_s, self.max_clients, self.clock = max_failures, window_s, max_clients, clock
        self._failures: dict[Any, collections.deque[float]] = {}
        self._running: collections.Counter[Any] = collections.Counter()

    def retry_after(self, client: Any) -> float:
        """Seconds until ``client`` may try a password again; 0: now."""
        now = self.clock()
        failures = self._failures.get(client)
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if failures is not None and not failures:
            del self._failures[client]
        if len(failures or ()) + self._running[client] < self.max_failures:
            return 0.0
        return max(failures[0] + self.window_s - now, 0.001) if failures else self.window_s

    def begin(self, client: Any) -> None:
        self._running[client] += 1

    def end(self, client: Any, *, ok: bool) -> None:
        self._running[client] -= 1
        if self._running[client] <= 0:
            del self._running[client]
        if ok:
            return
        if client not in self._failures and len(self._failures) >= self.max_clients:
            del self._failures[next(iter(self._failures))]  # the longest-known client: memory stays bounded
        self._failures.setdefault(client, collections.deque()).append(self.clock())


def needs_password_check(user: str | None, writer: Writer | None) -> bool:
    """Whether ``user``'s login runs the PBKDF2 check (the writer's user; nobody else's does)."""
    return writer is not None and user not in (None, "", "default") and user == writer.user
