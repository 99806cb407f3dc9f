"""monarch-rdma over real ibverbs: a soft-RoCE (rxe) device in a VM, two procs and the client
moving buffers through the package's own API by RDMA READ and WRITE, then a job over the
``ibverbs`` transport (``rdma_transport_job.py``: actor calls whose large parts move by RDMA
READ), both in one boot of the VM.

This machine's kernel has no rdma_rxe; Debian's has. ``rxevm/`` boots that kernel under QEMU
(software emulation), the guest mounts this machine's root read-only and runs
``rxevm/rdma_guest.py`` with this very interpreter, pyverbs coming from Debian's
``python3-pyverbs``. Minutes under emulation. Where the VM cannot start (no QEMU, kernel or
pyverbs: ``tools/system-packages.sh`` installs them), the test fails and says why; where
the guest cannot see this interpreter (under ``/tmp`` or ``/run``, which it mounts its own
file systems over: ``guest_paths``), it skips and says why.
"""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
from pathlib import Path

import _monarch_guard
import pytest
from guest_paths import GUEST_OWN, hidden_from_guest

import monarch

pytestmark = [pytest.mark.slow, pytest.mark.system, pytest.mark.timeout(1500)]

HERE = Path(__file__).resolve().parent / "rxevm"
PYVERBS = Path("/usr/lib/python3/dist-packages/pyverbs")


def missing() -> list[str]:
    lacking = [
        tool
        for tool in ("qemu-system-x86_64", "busybox", "modprobe", "cpio")
        if not shutil.which(tool)
    ]
    if not glob.glob("/boot/vmlinuz-*-amd64"):
        lacking.append("a Debian kernel (linux-image-amd64)")
    if not PYVERBS.is_dir():
        lacking.append("pyverbs (python3-pyverbs)")
    return lacking


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """Boot the VM once for this module: ``(its log, what QEMU printed)``."""
    lacking = missing()
    if lacking:
        pytest.fail(f"the soft-RoCE VM cannot start: missing {', '.join(lacking)}")
    hidden = hidden_from_guest(sys.executable)
    if hidden:  # the guest's scripts would end with status 127
        pytest.skip(
            f"the VM's guest mounts its own {' and '.join(GUEST_OWN)}, hiding this test's "
            f"Python: {', '.join(hidden)} (run the tests from an interpreter elsewhere)"
        )
    tmp_path = tmp_path_factory.mktemp("rxevm")
    build, share = tmp_path / "build", tmp_path / "share"
    (share / "pyverbs-path").mkdir(parents=True)
    (share / "pyverbs-path" / "pyverbs").symlink_to(PYVERBS)
    for name in ("guest-test.sh", "rdma_guest.py", "transport_faults.py"):
        shutil.copy(HERE / name, share / name)
    shutil.copy(HERE.parent / "rdma_transport_job.py", share / "rdma_transport_job.py")
    (share / "python").write_text(sys.executable)
    # The guest sees this machine's root file system but a /tmp of its own: an editable
    # install from a checkout under /tmp (CI's clean one) would be missing there, so the
    # monarch packages travel in the share.
    for portion in monarch.__path__:
        shutil.copytree(
            portion,
            share / "monarch-src" / "monarch",
            dirs_exist_ok=True,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    # ... with monarch-core's guard module beside the package (its .pth imports it at start)
    shutil.copy(_monarch_guard.__file__, share / "monarch-src" / "_monarch_guard.py")
    subprocess.run(["bash", str(HERE / "build-initramfs.sh"), str(build)], check=True, timeout=120)
    vm = subprocess.run(
        ["bash", str(HERE / "run-vm.sh"), str(build), str(share)],
        capture_output=True,
        text=True,
        timeout=1440,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "VM_TIMEOUT": "1400"},
    )
    log = (share / "guest.log").read_text() if (share / "guest.log").exists() else ""
    return log, f"VM exit {vm.returncode}\n{vm.stdout[-2000:]}"


def test_buffers_move_by_rdma_read_and_write_in_a_soft_roce_vm(guest: tuple[str, str]) -> None:
    log, vm = guest
    assert "RDMA-VERBS-OK" in log, f"{vm}\n{log[-6000:]}"
    assert log.count("read and written over ibverbs") == 3
    assert "a dead owner's buffer ends in RDMAOwnerDied" in log


def test_actor_calls_move_large_parts_by_rdma_over_the_ibverbs_transport(
    guest: tuple[str, str],
) -> None:
    log, vm = guest
    assert "TRANSPORT-JOB-OK" in log, f"{vm}\n{log[-6000:]}"
    assert "ok: large bytes and tensors delivered equal over the ibverbs transport" in log
    assert "moved by RDMA READ over ibverbs" in log


def test_the_ibverbs_transport_reads_only_what_was_offered_and_fails_on_a_dead_sender(
    guest: tuple[str, str],
) -> None:
    log, vm = guest
    assert "TRANSPORT-FAULTS-OK" in log, f"{vm}\n{log[-6000:]}"
    assert log.count("refused by the NIC") == 2
    assert "a dead sender fails the connection" in log
    assert "an end with rdma_disable_ibverbs makes the connection plain TCP" in log
