"""``monarch tls init`` / ``monarch tls issue``: a CA and certificates of one's own, with IP and
DNS SANs, that a worker and a controller (two monarch processes) then use for a real TLS job,
and that a client checking names accepts for each of them.
"""

from __future__ import annotations

import os
import secrets
import socket
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from hostkit import SECRET_ENV, children, worker_argv

from monarch.core._host._environ import ROOT_ENV
from monarch.core.testing import Child

CONTROLLER = Path(__file__).with_name("remote_controller.py")


def tls(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "monarch.core._command._cli", "tls", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    done = tls("init", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    done = tls("issue", "--dir", str(tmp_path), "127.0.0.1,localhost", "controller,::1")
    assert done.returncode == 0, done.stderr
    return tmp_path


def sans(path: Path) -> list[str]:
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [str(name.value) for name in names]


def test_init_and_issue_write_a_ca_and_certificates_with_ip_and_dns_names(pki: Path) -> None:
    assert sorted(p.name for p in pki.iterdir()) == [
        "127.0.0.1.pem",
        "ca-key.pem",
        "ca.pem",
        "controller.pem",
    ]
    assert sans(pki / "127.0.0.1.pem") == ["127.0.0.1", "localhost"]
    assert sans(pki / "controller.pem") == ["controller", "::1"]
    for private in ("ca-key.pem", "127.0.0.1.pem", "controller.pem"):
        assert stat.S_IMODE((pki / private).stat().st_mode) == 0o600
    again = tls("init", "--dir", str(pki))
    assert again.returncode != 0 and "--force" in again.stderr  # a CA is not overwritten
    bad = tls("issue", "--dir", str(pki), "a b")
    assert bad.returncode != 0 and "HOST[,NAME...]" in bad.stderr
    none = tls("issue", "--dir", str(pki / "nowhere"), "h")
    assert none.returncode != 0 and "monarch tls init" in none.stderr


@pytest.mark.parametrize("name", ["127.0.0.1", "localhost"])
def test_a_client_that_checks_names_accepts_the_issued_certificate(pki: Path, name: str) -> None:
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki / "127.0.0.1.pem")
    client = ssl.create_default_context(cafile=str(pki / "ca.pem"))  # checks the host name
    client.verify_flags |= ssl.VERIFY_X509_STRICT  # Python 3.13's default: RFC 5280's rules
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls_conn:
                tls_conn.sendall(b"ok")

        thread = threading.Thread(target=accept)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port), timeout=30) as raw,
            client.wrap_socket(raw, server_hostname=name) as conn,
        ):
            assert conn.recv(2) == b"ok"
        thread.join(30)


@pytest.fixture
def env() -> dict[str, str]:
    own = {k: v for k, v in os.environ.items() if k != ROOT_ENV}
    return {**own, SECRET_ENV: secrets.token_hex(32)}


@pytest.fixture
def start() -> Iterator[Callable[..., Child]]:
    with children() as start:
        yield start


def test_a_worker_and_a_controller_run_a_job_over_tls_with_the_issued_files(
    pki: Path, env: dict[str, str], start: Callable[..., Child]
) -> None:
    ca = str(pki / "ca.pem")
    extra = ["--ca", ca, "--private-key", str(pki / "127.0.0.1.pem")]
    worker = start(worker_argv("tls://127.0.0.1:0", *extra), env)
    address = worker.line(30)
    assert address.startswith("tls://127.0.0.1:"), address
    argv = [sys.executable, str(CONTROLLER), "tls", ca, str(pki / "controller.pem"), address]
    result = start(argv, env).json(60)
    assert result["controller"].startswith("tls://"), result
    assert result["procs"] and all(a.startswith("tls://") for a in result["procs"]), result
