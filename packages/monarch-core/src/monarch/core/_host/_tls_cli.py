"""``monarch tls``: a CA of one's own and certificates for the machines of a job, the PEM
files that ``monarch worker --ca ... --private-key ...`` and ``attach_to_workers(ca=...,
private_key=...)`` take (see the root README, "Running on several machines").

``monarch tls init`` writes ``ca.pem`` (the CA's certificate, for every machine) and
``ca-key.pem`` (its private key: keep it where certificates are issued, not on the
machines). ``monarch tls issue HOST[,NAME...]...`` writes, per argument, ``HOST.pem``: a
new private key followed by its certificate signed by that CA, naming the host and any
further names or addresses (IP SANs for addresses, DNS SANs for names). Our TLS checks
membership of the CA, not names; the SANs serve the other tools that do check them.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
from pathlib import Path
from typing import Any

from monarch.core._runtime._tls import _certificate, _cryptography, _key_pem

CA_NAME = "monarch CA"
DAYS = 365


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``monarch tls`` subcommand (entry point of ``monarch.commands``)."""
    parser = subparsers.add_parser(
        "tls",
        help="make a CA and certificates for TLS between machines (tls:// addresses)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    commands = parser.add_subparsers(dest="tls_command", metavar="COMMAND", required=True)
    init = commands.add_parser("init", help="write a new CA: ca.pem and ca-key.pem")
    init.add_argument("--dir", type=Path, default=Path("."), help="where (default: here)")
    init.add_argument("--days", type=int, default=DAYS, help=f"validity (default {DAYS})")
    init.add_argument("--force", action="store_true", help="replace an existing CA")
    init.set_defaults(func=_init)
    issue = commands.add_parser(
        "issue", help="write HOST.pem (key and certificate) for each HOST, signed by the CA"
    )
    issue.add_argument(
        "hosts",
        nargs="+",
        metavar="HOST[,NAME...]",
        help="a machine's name or address, then more of its names or addresses",
    )
    issue.add_argument("--dir", type=Path, default=Path("."), help="the CA's folder")
    issue.add_argument("--days", type=int, default=DAYS, help=f"validity (default {DAYS})")
    issue.set_defaults(func=_issue)


def _write_private(path: Path, data: bytes) -> None:
    """Readable by its owner only, from its creation on."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _validity(days: int) -> datetime.timedelta:
    if days < 1:
        raise SystemExit("monarch tls: --days must be at least 1")
    return datetime.timedelta(days=days)


def _init(args: argparse.Namespace) -> int:
    folder: Path = args.dir
    ca_pem, ca_key = folder / "ca.pem", folder / "ca-key.pem"
    if not args.force and (ca_pem.exists() or ca_key.exists()):
        raise SystemExit(f"monarch tls: {ca_pem} or {ca_key} exists (--force replaces them)")
    folder.mkdir(parents=True, exist_ok=True)
    _, _, _, ec, _ = _cryptography()
    key = ec.generate_private_key(ec.SECP256R1())
    validity = _validity(args.days)
    _, cert = _certificate(CA_NAME, key, CA_NAME, key, ca=True, validity=validity)
    _write_private(ca_key, _key_pem(key))
    ca_pem.write_bytes(cert)
    print(f"wrote {ca_pem} (give it to every machine) and {ca_key} (keep it here)")
    return 0


def _load_ca(folder: Path) -> tuple[Any, Any]:
    x509, _, serialization, _, _ = _cryptography()
    try:
        cert = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
        key = serialization.load_pem_private_key((folder / "ca-key.pem").read_bytes(), None)
    except FileNotFoundError as exc:
        raise SystemExit(
            f"monarch tls: no CA in {folder} ({exc.filename}): run monarch tls init"
        ) from None
    return cert, key


def _issue(args: argparse.Namespace) -> int:

    folder: Path = args.dir
    ca_cert, ca_key = _load_ca(folder)
    _, _, _, ec, name_oid = _cryptography()
    issuer = ca_cert.subject.get_attributes_for_oid(name_oid.COMMON_NAME)[0].value
    validity = _validity(args.days)
    for spec in args.hosts:
        names = [name for name in spec.split(",") if name]
        if not names or any(not re.fullmatch(r"[\w.:-]+", name) for name in names):
            raise SystemExit(f"monarch tls: {spec!r} is not HOST[,NAME...] (names, addresses)")
        key = ec.generate_private_key(ec.SECP256R1())
        _, cert = _certificate(
            names[0], key, issuer, ca_key, ca=False, names=names, validity=validity
        )
        path = folder / f"{names[0].replace(':', '_')}.pem"
        _write_private(path, _key_pem(key) + cert)
        print(f"wrote {path} ({', '.join(names)}): --private-key for that machine")
    return 0
