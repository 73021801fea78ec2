"""Server-side SASL mechanisms as small state machines, independent of sockets.

The server feeds each SaslAuthenticate request's bytes to :meth:`SaslServer.step` and answers with the bytes it
returns; a failure raises AuthenticationFailedError (Kafka's SASL_AUTHENTICATION_FAILED, 58), a message after
the exchange has completed or failed raises IllegalSaslStateError (ILLEGAL_SASL_STATE, 34, a subclass). Once
``complete`` is true, ``principal`` is the authenticated ``"User:<name>"``.

- PLAIN (RFC 4616): one message ``authzid NUL authcid NUL passwd``.
- SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677): client-first, server-first, client-final, server-final.
  No channel binding (the gs2 header is ``n,,``, or ``y,,`` from a client that could bind but sees that the
  server does not), no ``m=`` mandatory extensions and no extension attributes (Kafka's delegation-token
  ``tokenauth`` included). An unknown user gets a decoy salt and fails at the proof, with the same message as a
  wrong password, so the exchange's shape does not tell which users exist.

A failed exchange always says ``"Authentication failed: invalid user name or password"`` for a credential
mismatch; only malformed messages get a specific reason (they tell an attacker nothing).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Protocol

from pyspark_logsource.gateway.errors import AuthenticationFailedError
from pyspark_logsource.gateway.security.credentials import (
    MAX_USERNAME_CHARS,
    SCRAM_HASHES,
    CredentialStore,
    ScramCredential,
)
from pyspark_logsource.gateway.security.errors import IllegalSaslStateError, UnsupportedSaslMechanismError
from segment_format.errors import InvalidConfigError

PLAIN = "PLAIN"
SCRAM_SHA_256 = "SCRAM-SHA-256"
SCRAM_SHA_512 = "SCRAM-SHA-512"

#: No legitimate SASL message of these mechanisms comes near this size; a larger one is refused unread.
MAX_SASL_MESSAGE_BYTES = 8192

BAD_CREDENTIALS = "Authentication failed: invalid user name or password"


class SaslServer(Protocol):
    """One SASL exchange on the server side of one connection."""

    mechanism: str

    def step(self, client_message: bytes) -> bytes:
        """Consume the client's next message and return the server's reply (may be empty)."""
        ...

    @property
    def complete(self) -> bool:
        """True once the client has authenticated."""
        ...

    @property
    def principal(self) -> str | None:
        """``"User:<name>"`` once complete, None before."""
        ...


def mechanisms() -> list[str]:
    """The SASL mechanisms the gateway offers, as Kafka's SaslHandshake response lists them."""
    return [PLAIN, SCRAM_SHA_256, SCRAM_SHA_512]


def new_sasl_server(mechanism: str, store: CredentialStore) -> SaslServer:
    """A fresh server-side exchange for ``mechanism``; raise UnsupportedSaslMechanismError (Kafka's code 33)
    naming it and the offered ones if the gateway does not offer it."""
    if mechanism == PLAIN:
        return PlainServer(store)
    if mechanism in SCRAM_HASHES:
        return ScramServer(store, mechanism)
    raise UnsupportedSaslMechanismError(
        f"SASL mechanism {mechanism!r} is not supported; the gateway offers {', '.join(mechanisms())}"
    )


def _malformed(mechanism: str, what: str) -> AuthenticationFailedError:
    return AuthenticationFailedError(f"Authentication failed: malformed {mechanism} message: {what}")


def _decode(mechanism: str, message: bytes) -> str:
    if not isinstance(message, (bytes, bytearray, memoryview)):
        raise _malformed(mechanism, f"expected bytes, got {type(message).__name__}")
    if len(message) > MAX_SASL_MESSAGE_BYTES:
        raise _malformed(mechanism, f"{len(message)} bytes, more than {MAX_SASL_MESSAGE_BYTES}")
    try:
        return bytes(message).decode("utf-8")
    except UnicodeDecodeError as e:
        raise _malformed(mechanism, "not UTF-8") from e


class _Exchange:
    """The state every mechanism shares: done (authenticated), failed, and the principal."""

    mechanism: str

    def __init__(self) -> None:
        self._complete = False
        self._failed = False
        self._principal: str | None = None

    @property
    def complete(self) -> bool:
        """True once the client has authenticated."""
        return self._complete

    @property
    def principal(self) -> str | None:
        """``"User:<name>"`` once complete, None before."""
        return self._principal if self._complete else None

    def _check_open(self) -> None:
        if self._complete:
            raise IllegalSaslStateError(f"{self.mechanism} exchange already complete; no further message expected")
        if self._failed:
            raise IllegalSaslStateError(f"{self.mechanism} exchange already failed; start a new one")

    def _fail(self, error: AuthenticationFailedError) -> AuthenticationFailedError:
        self._failed = True
        return error


class PlainServer(_Exchange):
    """SASL/PLAIN (RFC 4616): ``authzid NUL authcid NUL passwd`` in one message; ``authzid`` must be empty or
    the same as ``authcid`` (the gateway has no impersonation)."""

    mechanism = PLAIN

    def __init__(self, store: CredentialStore) -> None:
        super().__init__()
        self._store = store

    def step(self, client_message: bytes) -> bytes:
        """Verify the one PLAIN message; return the empty reply or raise AuthenticationFailedError."""
        self._check_open()
        try:
            text = _decode(PLAIN, client_message)
            parts = text.split("\0")
            if len(parts) != 3:
                raise _malformed(PLAIN, f"expected 3 NUL-separated fields, got {len(parts)}")
            authzid, authcid, password = parts
            if not authcid or len(authcid) > MAX_USERNAME_CHARS:
                raise _malformed(PLAIN, f"user name must have 1..{MAX_USERNAME_CHARS} characters")
            if not password:
                raise _malformed(PLAIN, "empty password")
            if authzid and authzid != authcid:
                raise AuthenticationFailedError(
                    f"Authentication failed: authorization id {authzid!r} differs from user name {authcid!r}"
                )
            if not self._store.verify_plain(authcid, password):
                raise AuthenticationFailedError(BAD_CREDENTIALS)
        except AuthenticationFailedError as e:
            raise self._fail(e) from e.__cause__
        self._principal = f"User:{authcid}"
        self._complete = True
        return b""


def _parse_attributes(mechanism: str, text: str) -> list[tuple[str, str]]:
    """``a=value,b=value`` as pairs, in order; each attribute a single ASCII letter (RFC 5802 section 5)."""
    pairs = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=" or not ("a" <= part[0] <= "z" or "A" <= part[0] <= "Z"):
            raise _malformed(mechanism, f"attribute {part[:20]!r} is not of the form x=value")
        pairs.append((part[0], part[2:]))
    return pairs


def _unescape_saslname(mechanism: str, saslname: str) -> str:
    """RFC 5802's saslname: ``=2C`` is ``,`` and ``=3D`` is ``=``; any other ``=`` (and a bare ``,``) is invalid."""
    out = []
    i = 0
    while i < len(saslname):
        ch = saslname[i]
        if ch == "=":
            code = saslname[i + 1 : i + 3]
            if code == "2C":
                out.append(",")
            elif code == "3D":
                out.append("=")
            else:
                raise _malformed(mechanism, "user name has '=' not followed by 2C or 3D")
            i += 3
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def escape_saslname(name: str) -> str:
    """A user name as RFC 5802's saslname (``=`` as ``=3D``, ``,`` as ``=2C``), as a client sends it."""
    return name.replace("=", "=3D").replace(",", "=2C")


def _valid_nonce(nonce: str) -> bool:
    # RFC 5802: printable ASCII except ','.
    return bool(nonce) and all("\x21" <= ch <= "\x7e" and ch != "," for ch in nonce)


class ScramServer(_Exchange):
    """SCRAM-SHA-256 or SCRAM-SHA-512 (RFC 5802, RFC 7677) without channel binding.

    ``server_nonce`` is for tests replaying a published exchange (RFC 7677's test vector); by default each
    exchange draws 24 random bytes (base64url, 32 characters).
    """

    def __init__(self, store: CredentialStore, mechanism: str, *, server_nonce: str | None = None) -> None:
        super().__init__()
        if mechanism not in SCRAM_HASHES:
            raise UnsupportedSaslMechanismError(
                f"SASL mechanism {mechanism!r} is not a SCRAM mechanism; expected one of {sorted(SCRAM_HASHES)}"
            )
        if server_nonce is not None and not _valid_nonce(server_nonce):
            raise InvalidConfigError(f"server nonce {server_nonce!r} must be printable ASCII without ','")
        self.mechanism = mechanism
        self._digest = SCRAM_HASHES[mechanism]
        self._digest_size = hashlib.new(self._digest).digest_size
        self._store = store
        self._server_nonce = server_nonce if server_nonce is not None else secrets.token_urlsafe(24)
        # Set by the client-first message.
        self._gs2_header = ""
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._username = ""
        self._credential: ScramCredential | None = None
        self._known_user = False

    def step(self, client_message: bytes) -> bytes:
        """Consume client-first (returns server-first) or client-final (returns server-final ``v=...``)."""
        self._check_open()
        try:
            text = _decode(self.mechanism, client_message)
            if not self._server_first:
                return self._client_first(text).encode("utf-8")
            reply = self._client_final(text).encode("utf-8")
        except AuthenticationFailedError as e:
            raise self._fail(e) from e.__cause__
        self._principal = f"User:{self._username}"
        self._complete = True
        return reply

    def _client_first(self, text: str) -> str:
        mech = self.mechanism
        # gs2-header = gs2-cbind-flag "," [ authzid ] ","
        flag, sep1, rest = text.partition(",")
        authzid_part, sep2, bare = rest.partition(",")
        if not (sep1 and sep2):
            raise _malformed(mech, "client-first message has no gs2 header")
        if flag.startswith("p="):
            raise AuthenticationFailedError(
                f"Authentication failed: {mech} channel binding ({flag[:30]!r}) is not supported"
            )
        if flag not in ("n", "y"):
            raise _malformed(mech, f"gs2 channel-binding flag {flag[:20]!r} is not n, y or p=")
        authzid = None
        if authzid_part:
            if not authzid_part.startswith("a="):
                raise _malformed(mech, "gs2 authorization id must start with a=")
            authzid = _unescape_saslname(mech, authzid_part[2:])
        attributes = _parse_attributes(mech, bare)
        if attributes[0][0] == "m":
            raise AuthenticationFailedError(
                f"Authentication failed: {mech} mandatory extensions (m=) are not supported"
            )
        if len(attributes) < 2 or attributes[0][0] != "n" or attributes[1][0] != "r":
            raise _malformed(mech, "client-first message must be n=<user>,r=<nonce>")
        if len(attributes) > 2:
            raise AuthenticationFailedError(
                f"Authentication failed: {mech} extensions ({attributes[2][0]}=...) are not supported"
            )
        username = _unescape_saslname(mech, attributes[0][1])
        if not 1 <= len(username) <= MAX_USERNAME_CHARS:
            raise _malformed(mech, f"user name must have 1..{MAX_USERNAME_CHARS} characters")
        if authzid is not None and authzid != username:
            raise AuthenticationFailedError(
                f"Authentication failed: authorization id {authzid!r} differs from user name {username!r}"
            )
        client_nonce = attributes[1][1]
        if not _valid_nonce(client_nonce):
            raise _malformed(mech, "client nonce must be non-empty printable ASCII without ','")

        credential = self._store.scram_credential(username, mech)
        self._known_user = credential is not None
        if credential is None:
            credential = self._store.decoy_credential(username, mech)
        self._credential = credential
        self._username = username
        self._gs2_header = text[: len(flag) + len(authzid_part) + 2]
        self._client_first_bare = bare
        self._nonce = client_nonce + self._server_nonce
        salt = base64.b64encode(credential.salt).decode("ascii")
        self._server_first = f"r={self._nonce},s={salt},i={credential.iterations}"
        return self._server_first

    def _client_final(self, text: str) -> str:
        mech = self.mechanism
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise _malformed(mech, "client-final message has no proof (p=)")
        attributes = _parse_attributes(mech, without_proof)
        if len(attributes) < 2 or attributes[0][0] != "c" or attributes[1][0] != "r":
            raise _malformed(mech, "client-final message must be c=<binding>,r=<nonce>,p=<proof>")
        if len(attributes) > 2:
            raise AuthenticationFailedError(
                f"Authentication failed: {mech} extensions ({attributes[2][0]}=...) are not supported"
            )
        try:
            binding = base64.b64decode(attributes[0][1], validate=True)
            proof = base64.b64decode(proof_b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise _malformed(mech, "channel binding or proof is not base64") from e
        # Without channel binding, c= is the base64 of the gs2 header exactly as the client sent it first.
        if not hmac.compare_digest(binding, self._gs2_header.encode("utf-8")):
            raise AuthenticationFailedError(f"Authentication failed: {mech} channel binding data does not match")
        if not hmac.compare_digest(attributes[1][1].encode("utf-8"), self._nonce.encode("utf-8")):
            raise AuthenticationFailedError(f"Authentication failed: {mech} nonce does not match the server's")
        if len(proof) != self._digest_size:
            raise _malformed(mech, f"proof has {len(proof)} bytes; {mech} proofs have {self._digest_size}")

        credential = self._credential
        assert credential is not None  # set by the client-first message, which _server_first proves ran
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.new(credential.stored_key, auth_message, self._digest).digest()
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
        stored_key = hashlib.new(self._digest, client_key).digest()
        if not (hmac.compare_digest(stored_key, credential.stored_key) and self._known_user):
            raise AuthenticationFailedError(BAD_CREDENTIALS)
        server_signature = hmac.new(credential.server_key, auth_message, self._digest).digest()
        return "v=" + base64.b64encode(server_signature).decode("ascii")
