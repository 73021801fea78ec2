"""The gateway's TLS server context (``plog serve --tls-cert/--tls-key [--tls-ca] [--tls-require-client-cert]``)."""

from __future__ import annotations

import os
import ssl
from typing import Any

from pyspark_logsource.gateway.security.errors import TlsConfigError

#: RFC 4514 short names of the attribute types a client certificate's subject usually has.
_DN_SHORT_NAMES = {
    "commonName": "CN",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "countryName": "C",
    "stateOrProvinceName": "ST",
    "localityName": "L",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}


def server_ssl_context(
    certfile: str | os.PathLike[str],
    keyfile: str | os.PathLike[str],
    cafile: str | os.PathLike[str] | None = None,
    require_client_cert: bool = False,
) -> ssl.SSLContext:
    """A server-side TLS context: TLS 1.2 or newer, Python's default (forward-secret, AEAD) cipher choice, no
    TLS compression, the certificate chain ``certfile`` with its private key ``keyfile``.

    With ``cafile``, client certificates signed by those CAs are verified when a client offers one; with
    ``require_client_cert`` too, a client without one is refused (mutual TLS). ``require_client_cert`` without
    ``cafile`` is refused (nothing to verify against). A file that cannot be loaded raises TlsConfigError naming it.
    """
    if require_client_cert and cafile is None:
        raise TlsConfigError("requiring client certificates needs a CA file to verify them against")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION  # CRIME
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as e:
        raise TlsConfigError(
            f"cannot load the TLS certificate {os.fspath(certfile)!r} with key {os.fspath(keyfile)!r}: {e}"
        ) from e
    if cafile is not None:
        try:
            context.load_verify_locations(cafile=cafile)
        except (OSError, ssl.SSLError) as e:
            raise TlsConfigError(f"cannot load the TLS CA file {os.fspath(cafile)!r}: {e}") from e
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    else:
        context.verify_mode = ssl.CERT_NONE
    return context


def _escape_dn_value(value: str) -> str:
    # RFC 4514 section 2.4: these characters are escaped anywhere, a leading '#' or space and a trailing space too.
    out = "".join("\\" + ch if ch in ',+"\\<>;=' else ch for ch in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def peer_principal(peercert: dict[str, Any] | None) -> str | None:
    """Kafka's default principal of a verified client certificate (``ssl.SSLSocket.getpeercert()``):
    ``"User:"`` and the subject's distinguished name as RFC 4514 writes it (most specific first), e.g.
    ``"User:CN=alice,OU=eng,O=acme"``. None without a certificate."""
    if not peercert or not peercert.get("subject"):
        return None
    rdns = []
    # getpeercert lists the RDNs in the certificate's order (most general first); RFC 4514 reverses it.
    for rdn in reversed(peercert["subject"]):
        rdns.append("+".join(f"{_DN_SHORT_NAMES.get(key, key)}={_escape_dn_value(value)}" for key, value in rdn))
    return "User:" + ",".join(rdns)
