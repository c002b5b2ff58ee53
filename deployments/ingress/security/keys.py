"""API keys: loaded from the environment, kept only as SHA-256 digests, checked in constant time.
A key is known everywhere else (logs, metrics, cache, rate limits) by its key id, never itself."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deployments.config.security import KeyBudget, RateLimits, SecurityConfig
from deployments.errors import AuthenticationError, PermissionDeniedError, RouteNotFoundError
from deployments.ingress.security.open_mode import open_start_refusal

API_KEYS_ENV = "EDGE_API_KEYS"
API_KEYS_FILE_ENV = "EDGE_API_KEYS_FILE"
ADMIN_KEY_ENV = "EDGE_ADMIN_KEY"

ANONYMOUS_KEY_ID = "anonymous"  # every caller, when no key is configured
ADMIN_KEY_ID = "admin"
HASH_ID_PREFIX = "key-"
HASH_ID_HEX_CHARS = 8
# Below this a key is guessable; allowed (tests, demos) but warned about.
MIN_RECOMMENDED_KEY_CHARS = 16

KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
COMMENT_PREFIX = "#"
NAME_SEPARATOR = ":"

UNLIMITED = RateLimits()


class KeyConfigError(ValueError):
    """A malformed key source; the message never contains a secret."""


@dataclass(frozen=True)
class Principal:
    """Who a request comes from, as far as the router needs to know. The last three are set
    for virtual keys (deployments/ingress/state) only."""

    key_id: str
    limits: RateLimits
    is_admin: bool = False
    models: frozenset[str] | None = None  # the models it may use; None: every one
    budget: KeyBudget | None = None
    collect_payloads: bool = False  # its requests' payloads are kept in the request log

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


class VirtualKeyLookup(Protocol):
    """The keys made through the admin API, as this process last loaded them."""

    @property
    def has_keys(self) -> bool: ...

    def principal(self, digest: bytes) -> Principal | None:
        """The key with this digest; AuthenticationError if it expired."""
        ...

    def principal_of(self, key_id: str) -> Principal | None:
        """The unrevoked, unexpired key with this id."""
        ...


@dataclass(frozen=True)
class KeyEntry:
    """One configured key: its id, and the digest it is matched by."""

    key_id: str
    digest: bytes


def key_digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode("utf-8")).digest()


def hash_key_id(digest: bytes) -> str:
    """The id of an unnamed key: short enough for logs, and 32 bits of a digest reveal nothing
    usable about a random key."""
    return HASH_ID_PREFIX + digest.hex()[:HASH_ID_HEX_CHARS]


def parse_key_entry(entry: str, where: str) -> tuple[str | None, str]:
    """`[name:]secret` -> (name or None, secret). Whatever precedes the first ':' is the name, so
    a secret that contains ':' must be given a name."""
    name, separator, secret = entry.partition(NAME_SEPARATOR)
    if not separator:
        name, secret = "", entry
    elif not KEY_NAME.fullmatch(name):
        # The text before ':' may be part of a secret: do not echo it.
        raise KeyConfigError(
            f"{where}: the text before the first ':' must be a key name "
            f"({KEY_NAME.pattern}); a key containing ':' needs a name prefix"
        )
    if not secret:
        raise KeyConfigError(f"{where}: empty key")
    if any(char.isspace() for char in secret):
        raise KeyConfigError(f"{where}: a key must not contain whitespace")
    return name or None, secret


def parse_env_keys(value: str) -> list[tuple[str | None, str]]:
    """EDGE_API_KEYS: comma-separated `[name:]secret` entries; blanks around them are ignored."""
    entries = [part.strip() for part in value.split(",")]
    return [
        parse_key_entry(entry, f"{API_KEYS_ENV} entry {index + 1}")
        for index, entry in enumerate(entries)
        if entry
    ]


def parse_key_file(text: str, path: str) -> list[tuple[str | None, str]]:
    """A key file: one `[name:]secret` per line; blank lines and lines starting with '#' skipped.
    There are no trailing comments: '#' may be part of a key."""
    keys = []
    for number, line in enumerate(text.splitlines(), start=1):
        entry = line.strip()
        if entry and not entry.startswith(COMMENT_PREFIX):
            keys.append(parse_key_entry(entry, f"{path} line {number}"))
    return keys


def read_key_file(path: Path, log: logging.Logger) -> list[tuple[str | None, str]]:
    """The keys of EDGE_API_KEYS_FILE (on Kubernetes, a Secret mounted read-only). Each way it
    can fail gets its own message, naming the file and never its content."""
    where = f"{API_KEYS_FILE_ENV}={path}"
    try:
        text = path.read_text(encoding="utf-8")
        mode = path.stat().st_mode
    except FileNotFoundError:
        raise KeyConfigError(
            f"{where}: no such file (on Kubernetes: is the API keys Secret mounted there?)"
        ) from None
    except IsADirectoryError:
        raise KeyConfigError(f"{where}: is a directory; name the key file in it") from None
    except PermissionError:
        raise KeyConfigError(
            f"{where}: not readable by this process (uid {os.getuid()}); on Kubernetes give the "
            "Secret volume defaultMode 0440 and the pod an fsGroup"
        ) from None
    except UnicodeDecodeError:
        raise KeyConfigError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise KeyConfigError(f"{where}: cannot read it ({type(exc).__name__})") from None
    keys = parse_key_file(text, str(path))
    if not keys:
        # Naming a file says keys are wanted: an empty one is a mistake, not a wish to run open.
        raise KeyConfigError(f"{where}: holds no key (one `[name:]key` per line)")
    if mode & stat.S_IROTH:
        log.warning(
            "%s is readable by every user of this machine (mode %s): chmod 600 it",
            path,
            oct(stat.S_IMODE(mode)),
        )
    return keys


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Authorization: Bearer <token>` (the OpenAI SDK's way), or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


class KeyStore:
    """Authenticates requests against the configured user keys and the separate admin key.

    With no user key the API is open (every caller is `anonymous`); with no admin key the admin
    API does not exist (404)."""

    def __init__(
        self,
        user_keys: Sequence[tuple[str | None, str]],
        admin_key: str | None = None,
        config: SecurityConfig | None = None,
        log: logging.Logger | None = None,
        virtual: VirtualKeyLookup | None = None,
    ):
        self.config = config or SecurityConfig()
        self.log = log or logging.getLogger("ray.serve")
        self._entries = self._index(user_keys)
        self.virtual = virtual
        short = sorted(
            name or hash_key_id(key_digest(secret))
            for name, secret in user_keys
            if len(secret) < MIN_RECOMMENDED_KEY_CHARS
        )
        if short:
            self.log.warning(
                "API keys shorter than %d characters are guessable: %s",
                MIN_RECOMMENDED_KEY_CHARS,
                ", ".join(short),
            )
        self._admin_digest = key_digest(admin_key) if admin_key else None
        if self._admin_digest is not None and any(
            hmac.compare_digest(self._admin_digest, entry.digest) for entry in self._entries
        ):
            raise KeyConfigError(f"{ADMIN_KEY_ENV} is also a user key; they must differ")
        self._limits = {
            entry.key_id: self.config.limits_for(entry.key_id) for entry in self._entries
        }
        self._announce()

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        config: SecurityConfig | None = None,
        log: logging.Logger | None = None,
        virtual: VirtualKeyLookup | None = None,
    ) -> KeyStore:
        """Keys from EDGE_API_KEYS and the file named by EDGE_API_KEYS_FILE (both may be set),
        the admin key from EDGE_ADMIN_KEY. A named key file that cannot be read, or holds no key,
        stops the start, and so does no key at all on Kubernetes unless `security.allow_open`:
        running open by accident would be worse."""
        config = config or SecurityConfig()
        log = log or logging.getLogger("ray.serve")
        keys = parse_env_keys(environ.get(API_KEYS_ENV, ""))
        file_name = environ.get(API_KEYS_FILE_ENV, "").strip()
        if file_name:
            keys += read_key_file(Path(file_name), log)
        refusal = open_start_refusal(environ, has_keys=bool(keys), allow_open=config.allow_open)
        if refusal is not None:
            message = (
                f"refusing to start: {refusal}; give it keys ({API_KEYS_FILE_ENV} from the API "
                "keys Secret, see docs/kubernetes.md) or set security.allow_open: true"
            )
            log.error(message)
            raise KeyConfigError(message)
        admin_key = environ.get(ADMIN_KEY_ENV, "").strip() or None
        return cls(keys, admin_key, config, log, virtual)

    @staticmethod
    def _index(user_keys: Iterable[tuple[str | None, str]]) -> tuple[KeyEntry, ...]:
        entries: dict[str, KeyEntry] = {}
        digests: set[bytes] = set()
        for name, secret in user_keys:
            digest = key_digest(secret)
            key_id = name or hash_key_id(digest)
            if digest in digests:
                raise KeyConfigError(f"the key {key_id!r} is configured twice")
            if key_id in entries:
                raise KeyConfigError(f"two keys have the id {key_id!r}; name one of them")
            if key_id in (ANONYMOUS_KEY_ID, ADMIN_KEY_ID):
                raise KeyConfigError(f"{key_id!r} is reserved; choose another key name")
            digests.add(digest)
            entries[key_id] = KeyEntry(key_id, digest)
        return tuple(entries[key_id] for key_id in sorted(entries))

    def _announce(self) -> None:
        if self.is_open:
            self.log.warning(
                "SECURITY: no API key configured (%s / %s): the API is OPEN to anyone who can "
                "reach it",
                API_KEYS_ENV,
                API_KEYS_FILE_ENV,
            )
        else:
            self.log.info("%d API keys loaded: %s", len(self._entries), ", ".join(self.key_ids))
        unknown = sorted(set(self.config.per_key) - set(self.key_ids) - {ANONYMOUS_KEY_ID})
        if unknown:
            self.log.warning("security.per_key names keys that are not configured: %s", unknown)

    @property
    def is_open(self) -> bool:
        """No key at all: neither a configured one nor an unrevoked virtual one. The first
        virtual key made closes an open API."""
        return not self._entries and not (self.virtual is not None and self.virtual.has_keys)

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(entry.key_id for entry in self._entries)

    def _match(self, token: str) -> KeyEntry | None:
        # Every entry is compared, without stopping at a match, so the time taken does not
        # depend on which key (if any) matched.
        digest = key_digest(token)
        found = None
        for entry in self._entries:
            if hmac.compare_digest(digest, entry.digest):
                found = entry
        return found

    def _is_admin(self, token: str) -> bool:
        return self._admin_digest is not None and hmac.compare_digest(
            key_digest(token), self._admin_digest
        )

    def anonymous(self) -> Principal:
        """The caller of an open API. It shares one budget with every other caller, so only an
        explicit `per_key.anonymous` limits it: default_limits are meant per client."""
        override = self.config.per_key.get(ANONYMOUS_KEY_ID)
        return Principal(ANONYMOUS_KEY_ID, override or UNLIMITED)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller of a model endpoint; AuthenticationError (401) unless the key is known."""
        if self.is_open:
            return self.anonymous()
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationError(
                "missing API key: send it as 'Authorization: Bearer <key>'",
                code="missing_api_key",
            )
        entry = self._match(token)
        if entry is not None:
            return Principal(entry.key_id, self._limits[entry.key_id])
        virtual = self.virtual.principal(key_digest(token)) if self.virtual else None
        if virtual is None:
            raise AuthenticationError("invalid API key")
        return virtual

    def principal_of(self, key_id: str) -> Principal | None:
        """A key's principal by its id, for work done later in its name (a batch job's items):
        None once it is gone (no longer configured, revoked, expired)."""
        if key_id == ANONYMOUS_KEY_ID:
            return self.anonymous() if self.is_open else None
        if key_id in self._limits:
            return Principal(key_id, self._limits[key_id])
        return self.virtual.principal_of(key_id) if self.virtual is not None else None

    def authorize_admin(self, authorization: str | None, path: str = "/admin") -> Principal:
        """The caller of an /admin route: 404 when no admin key is configured, 401 without a
        known key, 403 for a user key."""
        if self._admin_digest is None:
            raise RouteNotFoundError(f"no route {path}")
        token = bearer_token(authorization)
        if token is None:
            raise AuthenticationError(
                "a valid admin key is required (Authorization: Bearer ...)",
                code="missing_api_key",
            )
        if self._is_admin(token):
            return Principal(ADMIN_KEY_ID, UNLIMITED, is_admin=True)
        if self._match(token) is not None or (
            self.virtual is not None and self.virtual.principal(key_digest(token)) is not None
        ):
            raise PermissionDeniedError("this key may not use the admin API")
        raise AuthenticationError("invalid admin key")
