"""Throwaway TLS material for the gateway's tests: a CA, a server certificate for 127.0.0.1/::1/localhost and a
client certificate, made at test time (nothing secret is checked in).

It uses the ``cryptography`` package when the venv has it, otherwise the ``openssl`` command line; both make the
same files, and the tests run both where both exist.
"""

from __future__ import annotations

import datetime
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_NAMES = ("localhost",)
SERVER_ADDRESSES = ("127.0.0.1", "::1")
CLIENT_CN = "alice"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the CA's certificate, the server's certificate and key, a client's certificate and key."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def have_cryptography() -> bool:
    """True if the ``cryptography`` package can be imported."""
    try:
        import cryptography.x509  # noqa: F401
    except ImportError:
        return False
    return True


def make_tls_files(directory: Path, backend: str | None = None) -> TlsFiles:
    """Write a fresh CA, server and client certificate (each valid for a day) into ``directory``.

    ``backend`` is ``"cryptography"``, ``"openssl"`` or None (the first available).
    """
    if backend is None:
        backend = "cryptography" if have_cryptography() else "openssl"
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
    if backend == "cryptography":
        _make_with_cryptography(files)
    elif backend == "openssl":
        _make_with_openssl(files, directory)
    else:
        raise ValueError(f"unknown TLS backend {backend!r}")
    return files


def _make_with_cryptography(files: TlsFiles) -> None:
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plog test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        subject: x509.Name, usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName | None
    ) -> tuple[bytes, bytes]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key_pem(key)

    server_san = x509.SubjectAlternativeName(
        [x509.DNSName(n) for n in SERVER_NAMES] + [x509.IPAddress(ipaddress.ip_address(a)) for a in SERVER_ADDRESSES]
    )
    server_cert, server_key = leaf(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), ExtendedKeyUsageOID.SERVER_AUTH, server_san
    )
    client_cert, client_key = leaf(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "plog"),
                x509.NameAttribute(NameOID.COMMON_NAME, CLIENT_CN),
            ]
        ),
        ExtendedKeyUsageOID.CLIENT_AUTH,
        None,
    )
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert)
    files.server_key.write_bytes(server_key)
    files.client_cert.write_bytes(client_cert)
    files.client_key.write_bytes(client_key)


def _make_with_openssl(files: TlsFiles, directory: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("neither the cryptography package nor the openssl command is available")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, cwd=directory)

    ca_key = directory / "ca.key"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(files.ca_cert), "-days", "1",
        "-subj", "/CN=plog test CA",
        "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")  # fmt: skip
    san = ",".join([f"DNS:{n}" for n in SERVER_NAMES] + [f"IP:{a}" for a in SERVER_ADDRESSES])
    leaves = (
        (files.server_cert, files.server_key, "/CN=localhost", "serverAuth", f"subjectAltName={san}\n"),
        (files.client_cert, files.client_key, f"/O=plog/CN={CLIENT_CN}", "clientAuth", ""),
    )
    for cert, key, subject, usage, extra in leaves:
        csr = cert.with_suffix(".csr")
        ext = cert.with_suffix(".ext")
        ext.write_text(f"basicConstraints=critical,CA:FALSE\nextendedKeyUsage={usage}\n{extra}")
        run("req", "-new", *ec, "-keyout", str(key), "-out", str(csr), "-subj", subject)
        run("x509", "-req", "-in", str(csr), "-CA", str(files.ca_cert), "-CAkey", str(ca_key),
            "-CAcreateserial", "-days", "1", "-sha256", "-extfile", str(ext), "-out", str(cert))  # fmt: skip
