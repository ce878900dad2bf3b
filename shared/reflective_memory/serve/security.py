"""Access rules of the web app: access tokens, per-user rights, CSRF tokens and safe binds.

Framework-free, so the rules are unit-testable without a server:

* `AccessPolicy` holds an optional admin token (every user) and user tokens (one user each).
  Without any token the app is open, which `check_bind` allows only on a loopback address.
* `Principal` is who a request acts as; `Principal.may_see(user_id)` is the per-user right.
* CSRF tokens are HMACs of the principal's name under a per-process secret: a page that can be
  read can post, a cross-site form that cannot read the page cannot.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from reflective_memory.errors import ConfigError, InvalidInputError
from reflective_memory.validation import check_id

__all__ = [
    "TOKEN_ENV",
    "Principal",
    "AccessPolicy",
    "is_loopback",
    "check_bind",
    "check_port",
    "parse_user_tokens",
    "token_from_env",
    "LOOPBACK_HOSTS",
]

#: Environment variable read for the admin token when `--token` is not given.
TOKEN_ENV = "REFLECTIVE_MEMORY_TOKEN"

_MIN_TOKEN_CHARS = 16

#: `Host` header names (port stripped) an open app bound to a loopback address accepts; a page
#: of another site that re-points its domain to 127.0.0.1 (DNS rebinding) is refused.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


@dataclass(frozen=True)
class Principal:
    """Who a request acts as.

    Attributes:
        name: `local` (no tokens configured), `admin`, or `user:<id>` for a user token.
        users: The user ids this principal may reach; `None` means every user.
    """

    name: str
    users: frozenset[str] | None = None

    def may_see(self, user_id: str) -> bool:
        """Whether this principal may read or change `user_id`'s data."""
        return self.users is None or user_id in self.users


class AccessPolicy:
    """Tokens and the CSRF secret of one running app.

    Args:
        admin_token: Grants every user (`None`: no admin token).
        user_tokens: `{user_id: token}`; each token grants only its user.
        secret: Key of the CSRF HMAC (default: a fresh random key per process).

    Raises:
        ConfigError: A token is shorter than 16 characters, holds anything but visible ASCII
            characters, or is used twice.
    """

    def __init__(
        self,
        admin_token: str | None = None,
        user_tokens: Mapping[str, str] | None = None,
        *,
        secret: bytes | None = None,
    ) -> None:
        self._by_token: dict[str, Principal] = {}
        if admin_token is not None:
            self._add(admin_token, Principal("admin"))
        for user_id, token in (user_tokens or {}).items():
            if not isinstance(user_id, str) or not user_id.strip():
                raise ConfigError("a user token needs a non-empty user id")
            self._add(token, Principal(f"user:{user_id}", frozenset([user_id])))
        self.secret = secret if secret is not None else secrets.token_bytes(32)

    def _add(self, token: str, principal: Principal) -> None:
        if not isinstance(token, str) or len(token) < _MIN_TOKEN_CHARS:
            raise ConfigError(f"access tokens need at least {_MIN_TOKEN_CHARS} characters")
        odd = next((c for c in token if not "!" <= c <= "~"), None)
        if odd is not None:  # what an HTTP header carries as typed: no space, control, invisible
            raise ConfigError(
                f"an access token holds {odd!r} (U+{ord(odd):04X}); tokens are visible ASCII "
                "characters only (letters, digits and punctuation)"
            )
        if token in self._by_token:
            raise ConfigError("the same access token is given twice")
        self._by_token[token] = principal

    @property
    def open(self) -> bool:
        """True when no token is configured: every request acts as `local`, with every right."""
        return not self._by_token

    def authenticate(self, token: str | None) -> Principal | None:
        """The principal a presented token stands for (`None`: missing or wrong token)."""
        if self.open:
            return Principal("local")
        if not token:
            return None
        found = None
        for known, principal in self._by_token.items():  # compare all, in constant time each
            if hmac.compare_digest(known.encode(), token.encode()):
                found = principal
        return found

    def csrf_token(self, principal: Principal) -> str:
        """The CSRF token forms and API clients of `principal` must send with a POST."""
        mac = hmac.new(self.secret, f"csrf:{principal.name}".encode(), hashlib.sha256)
        return mac.hexdigest()

    def check_csrf(self, principal: Principal, presented: str | None) -> bool:
        """Whether `presented` is `principal`'s CSRF token."""
        if not presented:
            return False
        return hmac.compare_digest(self.csrf_token(principal), presented)


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, policy: AccessPolicy) -> None:
    """Refuse to serve an open (token-less) app on an address other machines can reach.

    Raises:
        ConfigError: `host` is not a loopback address and no token is configured.
    """
    if not is_loopback(host) and policy.open:
        raise ConfigError(
            f"binding to {host} exposes the memories to other machines: give an access token "
            f"(--token or the {TOKEN_ENV} environment variable) or bind to 127.0.0.1"
        )


def token_from_env() -> str | None:
    """The admin token from the environment, if set and not empty."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    return value or None


def check_port(host: str, port: int) -> None:
    """Check that `port` is a port number and that `host:port` is free (0 picks one when served).

    Raises:
        ConfigError: It is out of range, or something else listens there.
    """
    if isinstance(port, bool) or not 0 <= port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {port}")
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), port))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def parse_user_tokens(items: Iterable[str], option: str = "--user-token") -> dict[str, str]:
    """`{user_id: token}` from `USER=TOKEN` items (as given to `option`).

    Raises:
        ConfigError: An item is not `USER=TOKEN`, a user is not a valid user id
            (`validation.check_id`: a NUL, more than 512 characters), or a user is given twice.
    """
    out: dict[str, str] = {}
    for item in items:
        user, sep, token = item.partition("=")
        if not sep or not user.strip() or not token:
            shown = item if len(item) <= 40 else item[:37] + "..."
            raise ConfigError(f"{option} must look like USER=TOKEN, got {shown!r}")
        try:
            check_id("the user", user.strip())
        except InvalidInputError as exc:
            raise ConfigError(f"{option}: {exc}") from None
        if user.strip() in out:
            raise ConfigError(f"{option} gives user {user.strip()!r} twice")
        out[user.strip()] = token
    return out
