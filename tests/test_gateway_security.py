"""The gateway's security layer (``pyspark_logsource.gateway.security``), without sockets except for TLS.

- Credentials: only salted hashes reach the file (its bytes are searched for the password), mode 0600, atomic
  replace, every malformed file refused naming the file and user.
- SASL: RFC 7677's SCRAM-SHA-256 exchange byte for byte, a round trip through kafka-python's independent SCRAM
  client, PLAIN, and every failure (wrong password, unknown user, bad nonce, bad channel binding, malformed and
  replayed messages, a message after completion); hypothesis feeds arbitrary bytes at each stage and only the
  gateway's own errors may come out.
- ACLs: Kafka's precedence (deny wins, no allow means denied, describe implied by read/write/delete/alter) and
  malformed files refused naming the file and rule index.
- TLS: a real TLS client against an asyncio server on 127.0.0.1, certificates made at test time by both
  backends of tests/gateway_tls.py; mutual TLS and the client's principal.
- The listener rule: no unauthenticated listener on a non-loopback address without the explicit flag.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import ssl
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_logsource.gateway.errors import AuthenticationFailedError, AuthorizationDeniedError, GatewayError
from pyspark_logsource.gateway.security import (
    Authorizer,
    CredentialStore,
    IllegalSaslStateError,
    InvalidAclFileError,
    InvalidCredentialsFileError,
    PlainServer,
    ScramServer,
    TlsConfigError,
    UnauthenticatedRemoteListenerError,
    UnknownUserError,
    UnsupportedSaslMechanismError,
    add_user_to_file,
    check_listener,
    denial_error_code,
    mechanisms,
    new_sasl_server,
    peer_principal,
    remove_user_from_file,
    server_ssl_context,
)
from pyspark_logsource.gateway.security.sasl import BAD_CREDENTIALS, escape_saslname
from segment_format.errors import InvalidConfigError
from tests.gateway_tls import have_cryptography, make_tls_files

PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def store() -> CredentialStore:
    """alice (PASSWORD), and a user whose name needs SCRAM's escaping."""
    s = CredentialStore()
    s.add_user("alice", PASSWORD)
    s.add_user("we,ird=name", "p4ss")
    return s


class ScramTestClient:
    """A minimal RFC 5802 client, so that the tests can build good messages and then break them."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: str | None = None) -> None:
        self.digest = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}[mechanism]
        self.user, self.password = user, password
        self.nonce = nonce or secrets.token_urlsafe(18)
        self.gs2 = "n,,"
        self.first_bare = f"n={escape_saslname(user)},r={self.nonce}"
        self.server_signature = b""

    def first(self) -> bytes:
        return (self.gs2 + self.first_bare).encode()

    def final(self, server_first: bytes, *, nonce: str | None = None, binding: str | None = None) -> bytes:
        attrs = dict(a.split("=", 1) for a in server_first.decode().split(","))
        assert attrs["r"].startswith(self.nonce)
        salted = hashlib.pbkdf2_hmac(self.digest, self.password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
        client_key = hmac.new(salted, b"Client Key", self.digest).digest()
        stored_key = hashlib.new(self.digest, client_key).digest()
        c = binding if binding is not None else base64.b64encode(self.gs2.encode()).decode()
        without_proof = f"c={c},r={nonce if nonce is not None else attrs['r']}"
        auth_message = f"{self.first_bare},{server_first.decode()},{without_proof}".encode()
        signature = hmac.new(stored_key, auth_message, self.digest).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = hmac.new(salted, b"Server Key", self.digest).digest()
        self.server_signature = hmac.new(server_key, auth_message, self.digest).digest()
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def scram_login(store: CredentialStore, mechanism: str, user: str, password: str) -> ScramServer:
    server = ScramServer(store, mechanism)
    client = ScramTestClient(mechanism, user, password)
    server_first = server.step(client.first())
    server_final = server.step(client.final(server_first))
    assert server_final == b"v=" + base64.b64encode(client.server_signature)
    return server


# -- credentials ---------------------------------------------------------------------------------------------


def test_credentials_file_holds_hashes_only_and_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    path.write_text("{}")
    path.chmod(0o644)  # a file that was readable by others is replaced by one that is not
    old_umask = os.umask(0)  # the mode must not depend on the umask
    try:
        store = CredentialStore()
        store.add_user("alice", PASSWORD)
        store.add_user("bob", "hunter2-é")
        store.save(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    for secret in (PASSWORD, "hunter2-é"):
        for form in (secret.encode(), base64.b64encode(secret.encode()), secret.encode().hex().encode()):
            assert form not in raw, f"the credentials file contains the password as {form!r}"
    # Nothing but the file is left in its directory (the temporary file was renamed over it).
    assert sorted(p.name for p in tmp_path.iterdir()) == ["users.json"]

    loaded = CredentialStore.load(path)
    assert loaded.users() == ["alice", "bob"]
    assert loaded.verify_plain("alice", PASSWORD)
    assert loaded.verify_plain("bob", "hunter2-é")
    assert not loaded.verify_plain("alice", PASSWORD + "x")
    assert not loaded.verify_plain("bob", PASSWORD)
    assert not loaded.verify_plain("carol", PASSWORD)


def test_stored_keys_are_rfc5802s(store: CredentialStore) -> None:
    for mechanism, digest in (("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")):
        c = store.scram_credential("alice", mechanism)
        assert c is not None and c.iterations == 4096 and len(c.salt) == 16
        salted = hashlib.pbkdf2_hmac(digest, PASSWORD.encode(), c.salt, c.iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        assert c.stored_key == hashlib.new(digest, client_key).digest()
        assert c.server_key == hmac.new(salted, b"Server Key", digest).digest()
        assert "stored" not in repr(c) and base64.b64encode(c.stored_key).decode() not in repr(c)
    # Each mechanism gets its own salt.
    a = store.scram_credential("alice", "SCRAM-SHA-256")
    b = store.scram_credential("alice", "SCRAM-SHA-512")
    assert a is not None and b is not None and a.salt != b.salt
    assert store.scram_credential("nobody", "SCRAM-SHA-256") is None
    assert store.scram_credential("alice", "PLAIN") is None


def test_add_and_remove_user_in_file(tmp_path: Path) -> None:
    path = tmp_path / "users.json"
    add_user_to_file(path, "alice", "one")  # creates the file
    add_user_to_file(path, "bob", "two")
    add_user_to_file(path, "alice", "three")  # a password change
    store = CredentialStore.load(path)
    assert store.users() == ["alice", "bob"]
    assert store.verify_plain("alice", "three") and not store.verify_plain("alice", "one")
    remove_user_from_file(path, "bob")
    assert CredentialStore.load(path).users() == ["alice"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(UnknownUserError, match="'bob'"):
        remove_user_from_file(path, "bob")
    with pytest.raises(InvalidCredentialsFileError, match="missing.json"):
        remove_user_from_file(tmp_path / "missing.json", "alice")
    with pytest.raises(InvalidCredentialsFileError, match="no-such-dir"):
        add_user_to_file(tmp_path / "no-such-dir" / "users.json", "alice", "one")


@pytest.mark.parametrize(
    ("name", "password", "iterations", "culprit"),
    [
        ("", "pw", 4096, "1..255"),
        ("x" * 256, "pw", 4096, "1..255"),
        ("tab\there", "pw", 4096, "non-printable"),
        ("alice", "", 4096, "empty"),
        ("alice", "x" * 1025, 4096, "longer than"),
        ("alice", "pw", 4095, "4095"),
        ("alice", "pw", 16385, "16385"),
        ("alice", "pw", True, "True"),
    ],
)
def test_add_user_refuses_bad_input(name: str, password: str, iterations: Any, culprit: str) -> None:
    with pytest.raises(InvalidCredentialsFileError, match=culprit):
        CredentialStore().add_user(name, password, iterations)


def test_names_with_comma_and_equals_and_unicode_are_users() -> None:
    store = CredentialStore()
    for name in ("a,b", "a=b", "=2C", "ünï çødé", "x" * 255):
        store.add_user(name, "pw")
        assert store.verify_plain(name, "pw")


def _good_document() -> dict[str, Any]:
    store = CredentialStore()
    store.add_user("alice", "pw")
    return {
        "version": 1,
        "users": {
            "alice": {
                m: {
                    "salt": base64.b64encode(c.salt).decode(),
                    "iterations": c.iterations,
                    "stored_key": base64.b64encode(c.stored_key).decode(),
                    "server_key": base64.b64encode(c.server_key).decode(),
                }
                for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")
                if (c := store.scram_credential("alice", m)) is not None
            }
        },
    }


def _break(path: list[Any], value: Any) -> dict[str, Any]:
    document = _good_document()
    target = document
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return document


@pytest.mark.parametrize(
    ("document", "culprit"),
    [
        ("not json", "not JSON"),
        ([], "top level"),
        ({"version": 2, "users": {}}, "version is 2"),
        ({"version": 1, "users": [], "extra": 1}, "unknown top-level"),
        ({"version": 1, "users": []}, "'users' must be"),
        ({"version": 1, "users": {"": {}}}, "1..255"),
        (_break(["users", "alice", "SCRAM-SHA-512"], KeyError), "alice.*exactly"),
        (_break(["users", "alice", "SCRAM-SHA-256", "salt"], "***"), "alice.*salt is not base64"),
        (_break(["users", "alice", "SCRAM-SHA-256", "salt"], ""), "alice.*salt is empty"),
        (_break(["users", "alice", "SCRAM-SHA-256", "iterations"], 100), "alice.*100"),
        (_break(["users", "alice", "SCRAM-SHA-256", "iterations"], "4096"), "alice.*integer"),
        (_break(["users", "alice", "SCRAM-SHA-512", "stored_key"], "AAAA"), "alice.*stored_key has 3 bytes"),
        (_break(["users", "alice", "SCRAM-SHA-256", "password"], "pw"), "alice.*must be an object with keys"),
    ],
)
def test_load_refuses_malformed_file_naming_it(tmp_path: Path, document: Any, culprit: str) -> None:
    path = tmp_path / "creds.json"
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    with pytest.raises(InvalidCredentialsFileError, match=culprit) as e:
        CredentialStore.load(path)
    assert str(path) in str(e.value)


def test_good_document_loads(tmp_path: Path) -> None:
    # The parametrized breakages above start from this document; it must itself be good.
    path = tmp_path / "creds.json"
    path.write_text(json.dumps(_good_document()))
    assert CredentialStore.load(path).verify_plain("alice", "pw")
    with pytest.raises(InvalidCredentialsFileError, match="missing.json"):
        CredentialStore.load(tmp_path / "missing.json")


# -- SCRAM ---------------------------------------------------------------------------------------------------


def test_rfc7677_scram_sha_256_test_vector() -> None:
    store = CredentialStore()
    store.add_user("user", "pencil", 4096, salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    server = new_sasl_server("SCRAM-SHA-256", store)
    assert isinstance(server, ScramServer)
    server = ScramServer(store, "SCRAM-SHA-256", server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert not server.complete and server.principal is None
    assert server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == (
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    )
    assert not server.complete
    final = (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert server.step(final) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.principal == "User:user"
    with pytest.raises(InvalidConfigError, match="server nonce"):
        ScramServer(store, "SCRAM-SHA-256", server_nonce="has,comma")
    # Replaying the final message on the completed exchange is an illegal state, not a second success.
    with pytest.raises(IllegalSaslStateError) as e:
        server.step(final)
    assert e.value.error_code == 34
    assert server.complete and server.principal == "User:user"
    # Replaying the captured exchange against a new session fails: its server nonce differs.
    fresh = ScramServer(store, "SCRAM-SHA-256")
    assert fresh.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").startswith(b"r=rOprNGfwEbeRWgbNEkqO")
    with pytest.raises(AuthenticationFailedError, match="nonce"):
        fresh.step(final)
    assert not fresh.complete and fresh.principal is None


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_round_trip_and_escaped_names(store: CredentialStore, mechanism: str) -> None:
    assert scram_login(store, mechanism, "alice", PASSWORD).principal == "User:alice"
    assert scram_login(store, mechanism, "we,ird=name", "p4ss").principal == "User:we,ird=name"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_with_kafka_pythons_client(store: CredentialStore, mechanism: str) -> None:
    scram = pytest.importorskip("kafka.net.sasl.scram")
    client = scram.ScramClient("alice", PASSWORD, mechanism)
    server = new_sasl_server(mechanism, store)
    client.process_server_first_message(server.step(client.first_message()))
    client.process_server_final_message(server.step(client.final_message()))  # raises on a wrong signature
    assert server.complete and server.principal == "User:alice"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_wrong_password_and_unknown_user_fail_alike(store: CredentialStore, mechanism: str) -> None:
    shapes = []
    for user, password in (("alice", "wrong"), ("mallory", PASSWORD)):
        server = ScramServer(store, mechanism)
        client = ScramTestClient(mechanism, user, password)
        server_first = server.step(client.first())
        shapes.append([(k, len(v)) for k, v in (a.split("=", 1) for a in server_first.decode().split(","))])
        with pytest.raises(AuthenticationFailedError) as e:
            server.step(client.final(server_first))
        assert str(e.value) == BAD_CREDENTIALS
        assert not server.complete and server.principal is None
        with pytest.raises(IllegalSaslStateError, match="failed"):
            server.step(client.final(server_first))
    # The unknown user's server-first has the same shape (nonce, a 16-byte salt, 4096 iterations) as a real one.
    assert shapes[0] == shapes[1]
    # ... and a stable salt, as a real user's would be.
    salts = {
        ScramServer(store, mechanism).step(ScramTestClient(mechanism, "mallory", "x").first()).split(b",")[1]
        for _ in range(2)
    }
    assert len(salts) == 1


def _first_then(store: CredentialStore, mechanism: str = "SCRAM-SHA-256") -> tuple[ScramServer, ScramTestClient, bytes]:
    server = ScramServer(store, mechanism)
    client = ScramTestClient(mechanism, "alice", PASSWORD)
    return server, client, server.step(client.first())


def test_scram_bad_nonce_echo(store: CredentialStore) -> None:
    server, client, server_first = _first_then(store)
    with pytest.raises(AuthenticationFailedError, match="nonce"):
        server.step(client.final(server_first, nonce=client.nonce + "forged"))
    server, client, server_first = _first_then(store)
    with pytest.raises(AuthenticationFailedError, match="nonce"):
        server.step(client.final(server_first, nonce=client.nonce))  # the client's part only


def test_scram_channel_binding_must_echo_gs2_header(store: CredentialStore) -> None:
    server, client, server_first = _first_then(store)
    with pytest.raises(AuthenticationFailedError, match="channel binding"):
        server.step(client.final(server_first, binding=base64.b64encode(b"y,,").decode()))


def test_scram_y_flag_and_matching_authzid_are_accepted(store: CredentialStore) -> None:
    for gs2 in ("y,,", "n,a=alice,"):
        server = ScramServer(store, "SCRAM-SHA-256")
        client = ScramTestClient("SCRAM-SHA-256", "alice", PASSWORD)
        client.gs2 = gs2
        server.step(client.final(server.step(client.first())))
        assert server.principal == "User:alice"


@pytest.mark.parametrize(
    ("first", "reason"),
    [
        (b"p=tls-unique,,n=alice,r=abc", "channel binding"),
        (b"n,,m=ext,n=alice,r=abc", "mandatory extensions"),
        (b"n,,n=alice,r=abc,x=ext", "extensions"),
        (b"n,a=bob,n=alice,r=abc", "authorization id"),
        (b"n,,n=alice", "n=<user>,r=<nonce>"),
        (b"n,,r=abc,n=alice", "n=<user>,r=<nonce>"),
        (b"n,,n=,r=abc", "1..255"),
        (b"n,,n=al=ice,r=abc", "2C or 3D"),
        (b"n,,n=alice,r=", "nonce"),
        (b"n,,n=alice,r=a b", "nonce"),
        (b"q,,n=alice,r=abc", "flag"),
        (b"n,x,n=alice,r=abc", "a="),
        (b"n,,", "x=value"),
        (b"", "gs2 header"),
        (b"n,,n=\xff,r=abc", "UTF-8"),
        (b"n,,n=alice,r=" + b"a" * 9000, "more than"),
    ],
)
def test_scram_malformed_client_first(store: CredentialStore, first: bytes, reason: str) -> None:
    server = ScramServer(store, "SCRAM-SHA-256")
    with pytest.raises(AuthenticationFailedError, match=reason):
        server.step(first)
    assert not server.complete
    with pytest.raises(IllegalSaslStateError):
        server.step(ScramTestClient("SCRAM-SHA-256", "alice", PASSWORD).first())


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda m: m.rsplit(b",p=", 1)[0], "no proof"),
        (lambda m: m.rsplit(b",p=", 1)[0] + b",p=!!notbase64", "not base64"),
        (lambda m: m.rsplit(b",p=", 1)[0] + b",p=AAAA", "proof has 3 bytes"),
        (lambda m: m.replace(b"c=biws,", b""), "c=<binding>"),
        (lambda m: m.replace(b",p=", b",x=1,p="), "extensions"),
        (lambda m: b"c=bi ws" + m[6:], "not base64"),
    ],
)
def test_scram_malformed_client_final(store: CredentialStore, mutate: Any, reason: str) -> None:
    server, client, server_first = _first_then(store)
    with pytest.raises(AuthenticationFailedError, match=reason):
        server.step(mutate(client.final(server_first)))
    assert not server.complete and server.principal is None


def test_scram_proof_bit_flip_fails(store: CredentialStore) -> None:
    server, client, server_first = _first_then(store, "SCRAM-SHA-512")
    final = client.final(server_first)
    head, proof = final.rsplit(b",p=", 1)
    flipped = bytearray(base64.b64decode(proof))
    flipped[0] ^= 1
    with pytest.raises(AuthenticationFailedError, match="invalid user name or password"):
        server.step(head + b",p=" + base64.b64encode(bytes(flipped)))


# -- PLAIN ---------------------------------------------------------------------------------------------------


def test_plain_success(store: CredentialStore) -> None:
    for message in (b"\0alice\0" + PASSWORD.encode(), b"alice\0alice\0" + PASSWORD.encode()):
        server = new_sasl_server("PLAIN", store)
        assert isinstance(server, PlainServer)
        assert not server.complete and server.principal is None
        assert server.step(message) == b""
        assert server.complete and server.principal == "User:alice"
        with pytest.raises(IllegalSaslStateError, match="already complete"):
            server.step(message)


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\0alice\0wrong", "invalid user name or password"),
        (b"\0mallory\0" + PASSWORD.encode(), "invalid user name or password"),
        (b"bob\0alice\0" + PASSWORD.encode(), "authorization id 'bob'"),
        (b"alice\0" + PASSWORD.encode(), "3 NUL-separated"),
        (b"\0alice\0pw\0", "3 NUL-separated"),
        (b"\0alice\0", "empty password"),
        (b"\0\0pw", "1..255"),
        (b"\0alice\0\xff", "UTF-8"),
        (b"", "3 NUL-separated"),
    ],
)
def test_plain_failures(store: CredentialStore, message: bytes, reason: str) -> None:
    server = PlainServer(store)
    with pytest.raises(AuthenticationFailedError, match=reason) as e:
        server.step(message)
    assert e.value.error_code == 58
    assert not server.complete and server.principal is None
    with pytest.raises(IllegalSaslStateError, match="failed"):
        server.step(b"\0alice\0" + PASSWORD.encode())


def test_mechanisms_and_unsupported_mechanism(store: CredentialStore) -> None:
    assert mechanisms() == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    for mechanism in mechanisms():
        assert new_sasl_server(mechanism, store).mechanism == mechanism
    for bad in ("GSSAPI", "OAUTHBEARER", "scram-sha-256", ""):
        with pytest.raises(UnsupportedSaslMechanismError, match=repr(bad)) as e:
            new_sasl_server(bad, store)
        assert e.value.error_code == 33 and isinstance(e.value, GatewayError)


# -- fuzzing: arbitrary bytes at each stage may raise the gateway's errors only -------------------------------

_SCRAM_ALPHABET = "nyp,=acrmsiv0123ABbiwsalice\0=2C=3D+/"
_FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _fuzz_step(server: Any, message: bytes) -> None:
    try:
        reply = server.step(message)
    except GatewayError:
        assert not server.complete and server.principal is None
        return
    assert isinstance(reply, bytes)


def _messages() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=300),
        st.text(alphabet=_SCRAM_ALPHABET, max_size=120).map(str.encode),
        st.text(max_size=80).map(lambda t: t.encode("utf-8", "surrogatepass")),
    )


@_FUZZ
@given(message=_messages(), mechanism=st.sampled_from(mechanisms()))
def test_fuzz_first_message(store: CredentialStore, message: bytes, mechanism: str) -> None:
    _fuzz_step(new_sasl_server(mechanism, store), message)


@_FUZZ
@given(message=_messages(), mechanism=st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
def test_fuzz_client_final(store: CredentialStore, message: bytes, mechanism: str) -> None:
    server, _client, _ = _first_then(store, mechanism)
    _fuzz_step(server, message)


@_FUZZ
@given(data=st.data(), mechanism=st.sampled_from(["SCRAM-SHA-256", "SCRAM-SHA-512"]))
def test_fuzz_mutated_client_final(store: CredentialStore, data: st.DataObject, mechanism: str) -> None:
    # Mutations of a valid message reach the deeper checks (nonce, binding, proof) that random bytes rarely do.
    server, client, server_first = _first_then(store, mechanism)
    final = bytearray(client.final(server_first))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(final) - 1))
        action = data.draw(st.sampled_from(["flip", "delete", "insert"]))
        if action == "flip":
            final[i] ^= data.draw(st.integers(1, 255))
        elif action == "delete":
            del final[i]
        else:
            final.insert(i, data.draw(st.sampled_from(b",=\0\xffpcr")))
    _fuzz_step(server, bytes(final))
    if server.complete:  # a mutation that kept the message valid (e.g. a flip undone by another)
        assert server.principal == "User:alice"


@_FUZZ
@given(message=_messages(), mechanism=st.sampled_from(mechanisms()))
def test_fuzz_after_completion(store: CredentialStore, message: bytes, mechanism: str) -> None:
    if mechanism == "PLAIN":
        server: Any = PlainServer(store)
        server.step(b"\0alice\0" + PASSWORD.encode())
    else:
        server = scram_login(store, mechanism, "alice", PASSWORD)
    with pytest.raises(IllegalSaslStateError):
        server.step(message)
    assert server.principal == "User:alice"


# -- ACLs ----------------------------------------------------------------------------------------------------


def _rule(**fields: Any) -> dict[str, Any]:
    base = {"principal": "User:alice", "resource": "topic", "name": "orders", "operations": ["read"]}
    return {**base, "permission": "allow", **fields}


def test_allow_all_allows_everything() -> None:
    authorizer = Authorizer.allow_all()
    assert authorizer.allowed("User:anyone", "topic", "x", "delete")
    assert authorizer.allowed("User:ANONYMOUS", "cluster", "kafka-cluster", "create")
    authorizer.authorize("User:anyone", "group", "g", "read")


def test_literal_prefixed_wildcard_and_principals() -> None:
    a = Authorizer.from_rules(
        [
            _rule(),
            _rule(principal="User:*", name="public.", pattern="prefixed", operations=["read", "write"]),
            _rule(principal="User:bob", name="*", operations=["describe"]),
            _rule(resource="group", name="etl", operations=["read"]),
        ]
    )
    assert a.allowed("User:alice", "topic", "orders", "read")
    assert not a.allowed("User:alice", "topic", "orders2", "read")  # literal is exact
    assert not a.allowed("User:alice", "topic", "orders", "write")  # operation not granted
    assert not a.allowed("User:carol", "topic", "orders", "read")  # another principal
    assert a.allowed("User:carol", "topic", "public.events", "write")  # User:* and prefixed
    assert not a.allowed("User:carol", "topic", "public", "write")  # shorter than the prefix
    assert not a.allowed("User:carol", "topic", "my.public.events", "write")  # a prefix, not a substring
    assert not a.allowed("Group:carol", "topic", "public.events", "write")  # User:* is every user, nothing else
    assert a.allowed("User:bob", "topic", "anything", "describe")  # literal "*"
    assert not a.allowed("User:bob", "topic", "anything", "read")
    assert a.allowed("User:alice", "group", "etl", "read")
    assert not a.allowed("User:alice", "group", "orders", "read")  # a topic rule grants nothing on a group


def test_deny_wins_over_allow() -> None:
    a = Authorizer.from_rules(
        [
            _rule(name="*", operations=["all"]),
            _rule(principal="User:*", name="secret.", pattern="prefixed", operations=["read"], permission="deny"),
            _rule(name="audit", operations=["all"], permission="deny"),
        ]
    )
    assert a.allowed("User:alice", "topic", "orders", "read")
    assert not a.allowed("User:alice", "topic", "secret.keys", "read")  # deny for everyone beats alice's allow
    assert a.allowed("User:alice", "topic", "secret.keys", "write")  # only read is denied
    assert a.allowed("User:alice", "topic", "secret.keys", "describe")  # a deny of read does not deny describe
    for op in ("read", "write", "describe", "delete", "describe_configs"):
        assert not a.allowed("User:alice", "topic", "audit", op)  # deny all


def test_implied_operations() -> None:
    for op in ("read", "write", "delete", "alter"):
        a = Authorizer.from_rules([_rule(operations=[op])])
        assert a.allowed("User:alice", "topic", "orders", "describe"), op
        assert not a.allowed("User:alice", "topic", "orders", "describe_configs"), op
    a = Authorizer.from_rules([_rule(operations=["alter_configs"])])
    assert a.allowed("User:alice", "topic", "orders", "describe_configs")
    assert not a.allowed("User:alice", "topic", "orders", "describe")
    a = Authorizer.from_rules([_rule(operations=["describe"])])
    assert not a.allowed("User:alice", "topic", "orders", "read")  # describe implies nothing
    a = Authorizer.from_rules([_rule(operations=["all"])])
    assert all(a.allowed("User:alice", "topic", "orders", op) for op in ("read", "write", "create", "alter_configs"))


def test_cluster_and_transactional_id_rules() -> None:
    a = Authorizer.from_rules(
        [
            {
                "principal": "User:alice",
                "resource": "cluster",
                "operations": ["idempotent_write"],
                "permission": "allow",
            },
            _rule(resource="transactional_id", name="tx-", pattern="prefixed", operations=["write"]),
        ]
    )
    assert a.allowed("User:alice", "cluster", "kafka-cluster", "idempotent_write")
    assert not a.allowed("User:alice", "cluster", "kafka-cluster", "create")
    assert a.allowed("User:alice", "transactional_id", "tx-1", "write")
    assert a.allowed("User:alice", "transactional_id", "tx-1", "describe")
    assert not a.allowed("User:alice", "transactional_id", "other", "describe")


def test_authorize_raises_with_kafkas_code() -> None:
    a = Authorizer.from_rules([])
    for resource, code in (("topic", 29), ("group", 30), ("cluster", 31), ("transactional_id", 53)):
        assert denial_error_code(resource) == code
        op = "describe"
        with pytest.raises(AuthorizationDeniedError, match=f"User:alice is not allowed to describe {resource}") as e:
            a.authorize("User:alice", resource, "n", op)
        assert e.value.error_code == code
    with pytest.raises(InvalidAclFileError, match="'broker'"):
        denial_error_code("broker")
    with pytest.raises(InvalidAclFileError, match="'read' does not apply to a cluster"):
        a.allowed("User:alice", "cluster", "kafka-cluster", "read")
    with pytest.raises(InvalidAclFileError, match="'bogus'"):
        Authorizer.allow_all().allowed("User:alice", "topic", "t", "bogus")


@pytest.mark.parametrize(
    ("rules", "culprit"),
    [
        ({"principal": "User:alice"}, "top level must be a JSON list"),
        ([_rule(), "rule"], "rule 1: must be a JSON object"),
        ([_rule(operation=["read"])], "rule 0: unknown keys \\['operation'\\]"),
        ([_rule(), _rule(), {k: v for k, v in _rule().items() if k != "permission"}], "rule 2: missing 'permission'"),
        ([_rule(principal="alice")], "rule 0: principal 'alice'"),
        ([_rule(principal="User:")], "rule 0: principal 'User:'"),
        ([_rule(resource="broker")], "rule 0: resource 'broker'"),
        ([_rule(name="")], "rule 0: name ''"),
        ([_rule(pattern="regex")], "rule 0: pattern 'regex'"),
        ([_rule(name="*", pattern="prefixed")], "rule 0: a prefixed pattern"),
        ([_rule(operations=[])], "rule 0: operations must be"),
        ([_rule(operations="read")], "rule 0: operations must be"),
        ([_rule(resource="group", operations=["write"])], "rule 0: operation 'write' does not apply to a group"),
        ([_rule(permission="maybe")], "rule 0: permission 'maybe'"),
    ],
)
def test_acl_file_refused_naming_file_and_rule(tmp_path: Path, rules: Any, culprit: str) -> None:
    path = tmp_path / "acls.json"
    path.write_text(json.dumps(rules))
    with pytest.raises(InvalidAclFileError, match=culprit) as e:
        Authorizer.load(path)
    assert str(path) in str(e.value)


def test_acl_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "acls.json"
    path.write_text(json.dumps([_rule(), _rule(name="x", permission="deny")]))
    a = Authorizer.load(path)
    assert len(a.rules) == 2 and a.allowed("User:alice", "topic", "orders", "read")
    path.write_text("[")
    with pytest.raises(InvalidAclFileError, match="not JSON"):
        Authorizer.load(path)
    with pytest.raises(InvalidAclFileError, match="missing.json"):
        Authorizer.load(tmp_path / "missing.json")


# -- TLS -----------------------------------------------------------------------------------------------------

_BACKENDS = [
    pytest.param("cryptography", marks=pytest.mark.skipif(not have_cryptography(), reason="no cryptography")),
    pytest.param("openssl", marks=pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")),
]


async def _echo_over_tls(
    server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, host: str
) -> tuple[bytes, Any, str | None]:
    """Start a TLS echo server on 127.0.0.1, send a line with a real TLS client; return the echo, what the
    server saw of the client's certificate, and the TLS version the connection used."""
    seen: list[Any] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("peercert"))
        try:
            writer.write(await reader.readline())
            await writer.drain()
        except (ssl.SSLError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ctx, server_hostname=host)
        try:
            writer.write(b"hello plog\n")
            await writer.drain()
            echo = await asyncio.wait_for(reader.readline(), 10)
            version = writer.get_extra_info("ssl_object").version()
        finally:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()
    return echo, seen[0] if seen else None, version


def _tls11_client(cafile: Path) -> ssl.SSLContext:
    """A client that speaks TLS 1.0/1.1 only (at OpenSSL's security level 0, which permits them)."""
    client = ssl.create_default_context(cafile=str(cafile))
    client.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client.minimum_version = ssl.TLSVersion.TLSv1
        client.maximum_version = ssl.TLSVersion.TLSv1_1
    return client


@pytest.mark.parametrize("backend", _BACKENDS)
def test_tls_listener_with_real_client(tmp_path: Path, backend: str) -> None:
    files = make_tls_files(tmp_path, backend)
    server_ctx = server_ssl_context(files.server_cert, files.server_key)
    assert server_ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server_ctx.verify_mode == ssl.CERT_NONE
    for host in ("localhost", "127.0.0.1"):
        client_ctx = ssl.create_default_context(cafile=str(files.ca_cert))
        echo, peercert, version = asyncio.run(_echo_over_tls(server_ctx, client_ctx, host))
        assert echo == b"hello plog\n"
        assert version in ("TLSv1.2", "TLSv1.3")
        assert peer_principal(peercert) is None
    # A client that does not trust the test CA refuses the server: the certificate really is the CA's doing.
    with pytest.raises(ssl.SSLCertVerificationError):
        asyncio.run(_echo_over_tls(server_ctx, ssl.create_default_context(), "localhost"))


def test_tls_server_refuses_tls_1_1(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    # The control: a server that permits TLS 1.1 does serve this client (else the refusal below proves nothing).
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.load_cert_chain(files.server_cert, files.server_key)
    try:
        _echo, _cert, version = asyncio.run(_echo_over_tls(permissive, _tls11_client(files.ca_cert), "localhost"))
    except (ssl.SSLError, ConnectionError) as e:
        pytest.skip(f"this platform's OpenSSL does not speak TLS 1.1 at all: {e!r}")
    assert version in ("TLSv1", "TLSv1.1")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        asyncio.run(
            _echo_over_tls(
                server_ssl_context(files.server_cert, files.server_key), _tls11_client(files.ca_cert), "localhost"
            )
        )


@pytest.mark.parametrize("backend", _BACKENDS)
def test_mutual_tls(tmp_path: Path, backend: str) -> None:
    files = make_tls_files(tmp_path, backend)
    server_ctx = server_ssl_context(files.server_cert, files.server_key, files.ca_cert, require_client_cert=True)
    assert server_ctx.verify_mode == ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(files.ca_cert))
    client_ctx.load_cert_chain(files.client_cert, files.client_key)
    echo, peercert, _version = asyncio.run(_echo_over_tls(server_ctx, client_ctx, "localhost"))
    assert echo == b"hello plog\n"
    assert peer_principal(peercert) == "User:CN=alice,O=plog"
    # Without a client certificate the server refuses (with TLS 1.3 the refusal arrives after the handshake).
    bare_client = ssl.create_default_context(cafile=str(files.ca_cert))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        echo, _cert, _version = asyncio.run(_echo_over_tls(server_ctx, bare_client, "localhost"))
        if echo == b"":  # the server closed the connection instead of echoing
            raise ConnectionError("the server closed the connection")
    # Optional client certificates: with cafile but not required, a bare client is served.
    optional_ctx = server_ssl_context(files.server_cert, files.server_key, files.ca_cert)
    assert optional_ctx.verify_mode == ssl.CERT_OPTIONAL
    assert asyncio.run(_echo_over_tls(optional_ctx, bare_client, "localhost"))[0] == b"hello plog\n"


def test_tls_config_errors_name_the_file(tmp_path: Path) -> None:
    files = make_tls_files(tmp_path)
    with pytest.raises(TlsConfigError, match="missing.pem"):
        server_ssl_context(tmp_path / "missing.pem", files.server_key)
    with pytest.raises(TlsConfigError, match="client.key"):
        server_ssl_context(files.server_cert, files.client_key)  # a key that does not match the certificate
    with pytest.raises(TlsConfigError, match="nope.pem"):
        server_ssl_context(files.server_cert, files.server_key, tmp_path / "nope.pem")
    with pytest.raises(TlsConfigError, match="CA file"):
        server_ssl_context(files.server_cert, files.server_key, require_client_cert=True)


def test_peer_principal_escapes_rfc4514() -> None:
    cert = {"subject": ((("countryName", "US"),), (("organizationName", "Acme, Inc."),), (("commonName", " a+b "),))}
    assert peer_principal(cert) == "User:CN=\\ a\\+b\\ ,O=Acme\\, Inc.,C=US"
    assert peer_principal({}) is None and peer_principal(None) is None


# -- the listener rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST", "localhost.", "::ffff:127.0.0.1"]
)
def test_loopback_listener_needs_no_authentication(host: str) -> None:
    check_listener(host, authenticated=False, allow_unauthenticated_remote=False)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "", "192.168.1.10", "10.0.0.1", "fe80::1", "example.com", "::ffff:10.0.0.1", "128.0.0.1"]
)
def test_remote_listener_needs_authentication_or_the_flag(host: str) -> None:
    with pytest.raises(UnauthenticatedRemoteListenerError, match="--allow-unauthenticated-remote") as e:
        check_listener(host, authenticated=False, allow_unauthenticated_remote=False)
    assert (repr(host) if host else "<all interfaces>") in str(e.value)
    assert isinstance(e.value, GatewayError)
    check_listener(host, authenticated=True, allow_unauthenticated_remote=False)
    check_listener(host, authenticated=False, allow_unauthenticated_remote=True)
