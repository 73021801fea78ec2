"""The gateway's credential store: a JSON file of hashed SCRAM secrets, never a password.

For each user and each of SCRAM-SHA-256 and SCRAM-SHA-512 the file keeps what RFC 5802 lets a server keep:
the salt, the iteration count, ``StoredKey = H(HMAC(SaltedPassword, "Client Key"))`` and
``ServerKey = HMAC(SaltedPassword, "Server Key")`` (base64). SASL/PLAIN is verified against the
SCRAM-SHA-256 entry: the offered password is salted and hashed the same way and its StoredKey compared
in constant time, so no plain password is needed anywhere.

The file looks like::

    {"version": 1,
     "users": {"alice": {"SCRAM-SHA-256": {"salt": "...", "iterations": 4096,
                                            "stored_key": "...", "server_key": "..."},
                         "SCRAM-SHA-512": {...}}}}

Passwords are hashed as their UTF-8 bytes, without SASLprep, as Kafka's own brokers and clients do, so that a
password with non-ASCII characters means the same bytes to the gateway and to every Kafka client.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark_logsource.gateway.security.errors import InvalidCredentialsFileError, UnknownUserError

#: The SCRAM mechanisms the store keeps a credential for, and the hash each one names.
SCRAM_HASHES: Mapping[str, str] = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}

#: RFC 7677 asks for at least 4096 iterations; Kafka's brokers refuse fewer, and Kafka's tools more than 16384.
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384
DEFAULT_ITERATIONS = 4096
#: Kafka's own tools salt with this many random bytes, RFC 7677's example too.
SALT_BYTES = 16
MAX_USERNAME_CHARS = 255
#: A password longer than this is refused at ``add_user``, and never hashed at PLAIN verification (PBKDF2's
#: cost grows with the password's length, so an unbounded one would be a cheap way to burn the server's CPU).
MAX_PASSWORD_BYTES = 1024
FILE_VERSION = 1


@dataclass(frozen=True)
class ScramCredential:
    """What a server keeps of one user's SCRAM password (RFC 5802 section 3): never the password itself."""

    mechanism: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    def __repr__(self) -> str:  # The keys are password equivalents for an offline attack; keep them out of logs.
        return f"ScramCredential(mechanism={self.mechanism!r}, iterations={self.iterations}, keys=<hidden>)"


def validate_username(name: object) -> str:
    """Return ``name`` if it is a valid user name: a string of 1..255 printable characters (``,`` and ``=``
    are allowed; SCRAM carries them escaped as ``=2C`` and ``=3D``). Raise InvalidCredentialsFileError naming it."""
    if not isinstance(name, str):
        raise InvalidCredentialsFileError(f"user name must be a string, not {type(name).__name__}")
    if not 1 <= len(name) <= MAX_USERNAME_CHARS:
        raise InvalidCredentialsFileError(f"user name {name!r} must have 1..{MAX_USERNAME_CHARS} characters")
    if not name.isprintable():
        raise InvalidCredentialsFileError(f"user name {name!r} has a non-printable character")
    return name


def _validate_password(name: str, password: object) -> bytes:
    if not isinstance(password, str):
        raise InvalidCredentialsFileError(f"password of user {name!r} must be a string")
    raw = password.encode("utf-8", "surrogatepass")
    if not raw:
        raise InvalidCredentialsFileError(f"password of user {name!r} must not be empty")
    if len(raw) > MAX_PASSWORD_BYTES:
        raise InvalidCredentialsFileError(f"password of user {name!r} is longer than {MAX_PASSWORD_BYTES} bytes")
    return raw


def _validate_iterations(name: str, iterations: object) -> int:
    # bool is an int in Python; ``true`` in a JSON file is a mistake, not 1 iteration.
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise InvalidCredentialsFileError(f"iteration count of user {name!r} must be an integer, not {iterations!r}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise InvalidCredentialsFileError(
            f"iteration count of user {name!r} is {iterations}; it must be in {MIN_ITERATIONS}..{MAX_ITERATIONS}"
        )
    return iterations


def salted_password(mechanism: str, password: bytes, salt: bytes, iterations: int) -> bytes:
    """RFC 5802's ``SaltedPassword = Hi(Normalize(password), salt, i)`` (PBKDF2 with the mechanism's HMAC)."""
    return hashlib.pbkdf2_hmac(SCRAM_HASHES[mechanism], password, salt, iterations)


def scram_keys(mechanism: str, salted: bytes) -> tuple[bytes, bytes, bytes]:
    """``(ClientKey, StoredKey, ServerKey)`` derived from a SaltedPassword, as RFC 5802 section 3 defines them."""
    digest = SCRAM_HASHES[mechanism]
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return client_key, stored_key, server_key


def make_scram_credential(
    mechanism: str, password: bytes, salt: bytes, iterations: int = DEFAULT_ITERATIONS
) -> ScramCredential:
    """The credential a server keeps for ``password`` under ``mechanism``, ``salt`` and ``iterations``."""
    _client_key, stored_key, server_key = scram_keys(mechanism, salted_password(mechanism, password, salt, iterations))
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


class CredentialStore:
    """Users and their hashed SCRAM credentials; loaded from and saved to a JSON file.

    A store is read-only while the gateway serves (lookups may come from many threads); the CLI changes one
    with :meth:`add_user` / :meth:`remove_user` and writes it back with :meth:`save`.
    """

    def __init__(self) -> None:
        self._users: dict[str, dict[str, ScramCredential]] = {}
        # A per-store secret from which unknown users get a salt that is stable (asking twice for the same
        # unknown name shows the same salt, as for a real user) and unguessable (it reveals nothing).
        self._decoy_secret = secrets.token_bytes(32)

    def __repr__(self) -> str:
        return f"CredentialStore(users={len(self._users)})"

    def __len__(self) -> int:
        return len(self._users)

    def __contains__(self, name: object) -> bool:
        return name in self._users

    def users(self) -> list[str]:
        """The user names, sorted."""
        return sorted(self._users)

    # -- changes ---------------------------------------------------------------------------------------------

    def add_user(
        self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS, *, salt: bytes | None = None
    ) -> None:
        """Add ``name`` with ``password``, or replace its credentials if it exists (a password change).

        Only salted hashes are kept. ``salt`` is for tests that replay a published exchange (the same salt is
        then used for both mechanisms); by default each mechanism gets 16 fresh random bytes.
        """
        validate_username(name)
        raw = _validate_password(name, password)
        _validate_iterations(name, iterations)
        if salt is not None and not salt:
            raise InvalidCredentialsFileError(f"salt of user {name!r} must not be empty")
        self._users[name] = {
            mechanism: make_scram_credential(mechanism, raw, salt or secrets.token_bytes(SALT_BYTES), iterations)
            for mechanism in SCRAM_HASHES
        }

    def remove_user(self, name: str) -> None:
        """Remove ``name``; raise UnknownUserError if the store does not hold it."""
        if name not in self._users:
            raise UnknownUserError(f"no user {name!r} in the credentials store")
        del self._users[name]

    # -- lookups ---------------------------------------------------------------------------------------------

    def scram_credential(self, name: str, mechanism: str) -> ScramCredential | None:
        """The user's credential for ``mechanism`` ("SCRAM-SHA-256" or "SCRAM-SHA-512"); None if unknown."""
        entry = self._users.get(name)
        return None if entry is None else entry.get(mechanism)

    def decoy_credential(self, name: str, mechanism: str) -> ScramCredential:
        """A credential no password matches, for a user the store does not hold: the SCRAM exchange of an
        unknown user then looks like a real one (a stable salt, the default iterations) and fails at the proof."""
        digest = SCRAM_HASHES[mechanism]
        seed = hmac.new(self._decoy_secret, f"{mechanism}\0{name}".encode("utf-8", "surrogatepass"), digest).digest()
        # Random keys: no ClientKey hashes to this StoredKey, so no proof can pass.
        size = hashlib.new(digest).digest_size
        return ScramCredential(
            mechanism, seed[:SALT_BYTES], DEFAULT_ITERATIONS, secrets.token_bytes(size), secrets.token_bytes(size)
        )

    def verify_plain(self, name: str, password: str) -> bool:
        """True if ``password`` is ``name``'s password (SASL/PLAIN), checked against the SCRAM-SHA-256 entry.

        An unknown user costs the same PBKDF2 work as a known one and answers False, so that the answer's
        timing does not tell whether the user exists.
        """
        mechanism = "SCRAM-SHA-256"
        credential = self.scram_credential(name, mechanism)
        known = credential is not None
        if credential is None:
            credential = self.decoy_credential(name, mechanism)
        raw = password.encode("utf-8", "surrogatepass")
        if not raw or len(raw) > MAX_PASSWORD_BYTES:
            return False
        _client_key, stored_key, _server_key = scram_keys(
            mechanism, salted_password(mechanism, raw, credential.salt, credential.iterations)
        )
        return hmac.compare_digest(stored_key, credential.stored_key) and known

    # -- the file --------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CredentialStore:
        """Read a credentials file; raise InvalidCredentialsFileError naming the file (and user) if it is bad."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise InvalidCredentialsFileError(f"cannot read credentials file {str(path)!r}: {e}") from e
        try:
            document = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidCredentialsFileError(f"credentials file {str(path)!r} is not JSON: {e}") from e
        store = cls()
        try:
            store._users = _parse_document(document)
        except InvalidCredentialsFileError as e:
            raise InvalidCredentialsFileError(f"credentials file {str(path)!r}: {e}") from e
        return store

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the store to ``path`` atomically (a temporary file in the same directory, fsynced, renamed
        over it), readable and writable by its owner only (mode 0600) whatever the umask."""
        path = Path(path)
        document = {
            "version": FILE_VERSION,
            "users": {
                name: {
                    mechanism: {
                        "salt": _b64(c.salt),
                        "iterations": c.iterations,
                        "stored_key": _b64(c.stored_key),
                        "server_key": _b64(c.server_key),
                    }
                    for mechanism, c in sorted(entry.items())
                }
                for name, entry in sorted(self._users.items())
            },
        }
        data = (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        directory = path.parent
        # mkstemp creates the file with mode 0600 already: the hashes are never readable by others, not even
        # for the moment between creating and renaming.
        try:
            fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        except OSError as e:
            raise InvalidCredentialsFileError(f"cannot write credentials file {str(path)!r}: {e}") from e
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o600)
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp_name, path)
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp_name)
            if isinstance(e, OSError):
                raise InvalidCredentialsFileError(f"cannot write credentials file {str(path)!r}: {e}") from e
            raise
        # The rename is durable once the directory is synced (not every platform lets a directory be opened).
        with contextlib.suppress(OSError):
            dir_fd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _unb64(user: str, mechanism: str, field: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise InvalidCredentialsFileError(f"user {user!r} {mechanism} {field} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise InvalidCredentialsFileError(f"user {user!r} {mechanism} {field} is not base64: {e}") from e


def _parse_document(document: Any) -> dict[str, dict[str, ScramCredential]]:
    if not isinstance(document, dict):
        raise InvalidCredentialsFileError("the top level must be a JSON object with 'version' and 'users'")
    unknown = set(document) - {"version", "users"}
    if unknown:
        raise InvalidCredentialsFileError(f"unknown top-level keys {sorted(unknown)}")
    if document.get("version") != FILE_VERSION:
        raise InvalidCredentialsFileError(f"version is {document.get('version')!r}; this gateway reads {FILE_VERSION}")
    users = document.get("users")
    if not isinstance(users, dict):
        raise InvalidCredentialsFileError("'users' must be a JSON object of user name to credentials")
    parsed: dict[str, dict[str, ScramCredential]] = {}
    for name, entry in users.items():
        validate_username(name)
        if not isinstance(entry, dict):
            raise InvalidCredentialsFileError(f"user {name!r} must map mechanism names to credentials")
        if set(entry) != set(SCRAM_HASHES):
            raise InvalidCredentialsFileError(
                f"user {name!r} has mechanisms {sorted(entry)}; it must have exactly {sorted(SCRAM_HASHES)}"
            )
        parsed[name] = {mechanism: _parse_credential(name, mechanism, entry[mechanism]) for mechanism in entry}
    return parsed


def _parse_credential(name: str, mechanism: str, value: Any) -> ScramCredential:
    fields = {"salt", "iterations", "stored_key", "server_key"}
    if not isinstance(value, dict) or set(value) != fields:
        raise InvalidCredentialsFileError(f"user {name!r} {mechanism} must be an object with keys {sorted(fields)}")
    salt = _unb64(name, mechanism, "salt", value["salt"])
    if not salt:
        raise InvalidCredentialsFileError(f"user {name!r} {mechanism} salt is empty")
    iterations = _validate_iterations(name, value["iterations"])
    size = hashlib.new(SCRAM_HASHES[mechanism]).digest_size
    keys = []
    for field in ("stored_key", "server_key"):
        key = _unb64(name, mechanism, field, value[field])
        if len(key) != size:
            raise InvalidCredentialsFileError(
                f"user {name!r} {mechanism} {field} has {len(key)} bytes; {mechanism} keys have {size}"
            )
        keys.append(key)
    return ScramCredential(mechanism, salt, iterations, keys[0], keys[1])


def add_user_to_file(
    path: str | os.PathLike[str], name: str, password: str, iterations: int = DEFAULT_ITERATIONS
) -> None:
    """Add ``name`` (or change its password) in the credentials file at ``path``, creating the file if it does not
    exist (``plog serve users add FILE NAME``). Two concurrent changes of one file may lose one of them."""
    store = CredentialStore.load(path) if Path(path).exists() else CredentialStore()
    store.add_user(name, password, iterations)
    store.save(path)


def remove_user_from_file(path: str | os.PathLike[str], name: str) -> None:
    """Remove ``name`` from the credentials file at ``path`` (``plog serve users remove FILE NAME``); raise
    UnknownUserError if the file does not hold it, InvalidCredentialsFileError if the file is missing or bad."""
    store = CredentialStore.load(path)
    store.remove_user(name)
    store.save(path)
