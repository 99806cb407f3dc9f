"""TLS between machines: the job's certificate authority and this process's certificate.

Every connection is authenticated by the job secret (monarch-transport's handshake), over
TLS or not. TLS adds encryption and proves the machine: a listener presents a certificate,
the connecting side checks it against the CA and presents its own, which the listener
checks too (mutual TLS). A certificate proves membership of the CA, not a host name:
procs are reached at addresses chosen at run time, which no certificate can list.

Where this process's identity comes from, first match:

* ``use_identity``: a worker (``run_worker_loop_forever``) or a controller
  (``attach_to_workers``) given upstream's ``ca=`` (PEM bytes or a path) and
  ``private_key=`` (a PEM holding this machine's private key and its certificate);
  ``ca="trust_all_connections"`` encrypts without checking, with a throwaway self-signed
  certificate when no key is given;
* the environment: a proc inherits its parent's identity there (as it inherits the job
  secret, and as with the secret the variables leave the environment once read);
* a job CA made here (``default_transport="tls"`` with nothing given): the controller
  makes a CA and one certificate for the job's processes, which its procs inherit.

Making certificates needs the ``cryptography`` package (monarch-core depends on it through
``monarch-transport[fast]``); loading given ones needs only the standard library.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from monarch.transport import Address

TRUST_ALL: Final = "trust_all_connections"
"""Upstream's ``ca=`` value for encryption without checking certificates."""
CA_ENV: Final = "MONARCH_TLS_CA"
"""The CA certificates (PEM) a proc checks peers against; ``trust_all_connections`` for none."""
CHAIN_ENV: Final = "MONARCH_TLS_CHAIN"
"""A proc's private key and certificate (PEM), inherited from its host agent."""
VALIDITY: Final = datetime.timedelta(days=30)
"""How long a job CA (and its certificate) made here stays valid."""

PrivateKey = bytes | Path | None
CA = bytes | Path | Literal["trust_all_connections"] | None


@dataclass(frozen=True, eq=False)
class TlsIdentity:
    """A private key with its certificate chain, and the CA that peers must be signed by."""

    chain: bytes
    """PEM: the private key, its certificate, then any intermediate certificates."""
    ca: bytes | None
    """PEM CA certificates; None trusts every peer (encryption only)."""

    @functools.cached_property
    def server_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_SERVER)

    @functools.cached_property
    def client_context(self) -> ssl.SSLContext:
        return self._context(ssl.PROTOCOL_TLS_CLIENT)

    def _context(self, protocol: int) -> ssl.SSLContext:
        context = ssl.SSLContext(protocol)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = False  # membership of the CA, not a name (see the module)
        if self.ca is None:
            context.verify_mode = ssl.CERT_NONE
        else:
            context.load_verify_locations(cadata=self.ca.decode("ascii"))
            context.verify_mode = ssl.CERT_REQUIRED
        _load_chain(context, self.chain)
        return context

    def environment(self) -> dict[str, str]:
        """What a proc started by this process inherits (see ``from_environment``)."""
        ca = TRUST_ALL if self.ca is None else self.ca.decode("ascii")
        return {CA_ENV: ca, CHAIN_ENV: self.chain.decode("ascii")}


def _load_chain(context: ssl.SSLContext, chain: bytes) -> None:
    """``load_cert_chain`` from bytes: ssl reads only files, so through a private one."""
    import tempfile  # with shutil: ~2 ms that a process without TLS need not import

    with tempfile.TemporaryDirectory(prefix="monarch-tls-") as folder:
        path = Path(folder) / "chain.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(chain)
        try:
            context.load_cert_chain(path)
        except ssl.SSLError as exc:
            raise ValueError(
                "private_key must be PEM holding a private key and its certificate "
                f"(cat key.pem cert.pem): {exc.reason or exc}"
            ) from None


_installed: list[TlsIdentity] = []


def use_identity(identity: TlsIdentity) -> None:
    """Make ``identity`` this process's, for every TLS listener and connection from now."""
    _installed[:] = [identity]


def _read(value: bytes | Path | str, what: str) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, (Path, str)):
        try:
            return Path(value).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read {what} {os.fspath(value)!r}: {exc.strerror}") from None
    raise TypeError(f"{what} must be PEM bytes or a path, not {type(value).__name__}")


def identity_from(ca: CA, private_key: PrivateKey) -> TlsIdentity | None:
    """The identity upstream's ``ca=``/``private_key=`` arguments describe (None: neither)."""
    if ca is None and private_key is None:
        return None
    trust_all = ca == TRUST_ALL
    if ca is None and private_key is not None:
        raise ValueError(
            f"private_key= needs ca= too: the CA that signed the peers' certificates, "
            f"or ca={TRUST_ALL!r}"
        )
    if private_key is None:
        if not trust_all:
            raise ValueError(
                "ca= with a CA certificate needs private_key= too (PEM holding this "
                "machine's key and a certificate that CA signed): peers check it"
            )
        return self_signed_identity()
    assert ca is not None
    chain = _read(private_key, "private_key")
    identity = TlsIdentity(chain, None if trust_all else _read(ca, "ca"))
    identity.server_context  # noqa: B018 - load now: a bad key fails here, not at first use
    return identity


def from_environment() -> TlsIdentity | None:
    """The identity a proc inherits (taken out of the environment, like the job secret)."""
    ca = os.environ.pop(CA_ENV, None)
    chain = os.environ.pop(CHAIN_ENV, None)
    if ca is None or chain is None:
        return None
    return TlsIdentity(chain.encode("ascii"), None if ca == TRUST_ALL else ca.encode("ascii"))


def current_identity() -> TlsIdentity:
    """This process's identity: installed, inherited, or a job CA made now."""
    identity = installed_identity()
    if identity is None:
        identity = job_identity()
        _installed.append(identity)
    return identity


def installed_identity() -> TlsIdentity | None:
    """This process's identity if it has one (installed or inherited), without making one."""
    if not _installed:
        inherited = from_environment()
        if inherited is not None:
            _installed.append(inherited)
    return _installed[0] if _installed else None


def tls_options(url: str, *, server: bool) -> dict[str, Any]:
    """Transport options for listening at (``server``) or connecting to ``url``."""
    if Address.parse(url).scheme != "tls":
        return {}
    identity = current_identity()
    return {"ssl_context": identity.server_context if server else identity.client_context}


# -- making certificates ------------------------------------------------------------------


def _cryptography() -> Any:
    try:
        import cryptography  # noqa: F401 - optional: only to make certificates
    except ImportError:
        raise RuntimeError(
            "TLS without certificates of your own needs the cryptography package to make "
            "the job's: pip install cryptography (or give ca= and private_key=)"
        ) from None
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    return x509, hashes, serialization, ec, NameOID


def _certificate(
    subject: str,
    key: Any,
    issuer: str,
    signer: Any,
    *,
    ca: bool,
    names: list[str] | None = None,
    validity: datetime.timedelta = VALIDITY,
) -> tuple[Any, bytes]:
    """A certificate of ``key`` signed by ``signer``; one that is not a CA's names this
    machine (``names``: host names and IP addresses, default its own name and loopback).
    With the key identifiers and usages RFC 5280 asks for: a client with
    ``VERIFY_X509_STRICT`` (Python 3.13's default context) refuses a chain without them
    ("Missing Authority Key Identifier")."""
    x509, hashes, serialization, _, name_oid = _cryptography()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(name_oid.COMMON_NAME, issuer)]))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
        )
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )
    if not ca:
        usages = [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        given = names if names is not None else [socket.gethostname(), "localhost", "127.0.0.1"]
        sans = [_san(x509, name) for name in given]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(signer, hashes.SHA256())
    return cert, cert.public_bytes(serialization.Encoding.PEM)


def _san(x509: Any, name: str) -> Any:
    """An IP address SAN for an address, a DNS one for a host name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _key_pem(key: Any) -> bytes:
    _, _, serialization, _, _ = _cryptography()
    pem: bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem


def job_identity() -> TlsIdentity:
    """A new CA for this job, and a certificate it signed for the job's processes."""
    _, _, _, ec, _ = _cryptography()
    ca_key = ec.generate_private_key(ec.SECP256R1())
    _, ca_pem = _certificate("monarch job CA", ca_key, "monarch job CA", ca_key, ca=True)
    key = ec.generate_private_key(ec.SECP256R1())
    _, cert_pem = _certificate("monarch job", key, "monarch job CA", ca_key, ca=False)
    return TlsIdentity(_key_pem(key) + cert_pem, ca_pem)


def self_signed_identity() -> TlsIdentity:
    """A throwaway certificate for ``trust_all_connections``: encryption, no checking."""
    _, _, _, ec, _ = _cryptography()
    key = ec.generate_private_key(ec.SECP256R1())
    _, cert_pem = _certificate("monarch", key, "monarch", key, ca=False)
    return TlsIdentity(_key_pem(key) + cert_pem, None)
