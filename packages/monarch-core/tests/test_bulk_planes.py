"""The bulk-data planes' registry: a plane registered through an entry point (a real
distribution on ``sys.path``, dist-info as pip writes it) is found and asked in its order,
one is chosen per loan, a write falls to the next plane that can; a missing, duplicated or
malformed plane is a clear error."""

from __future__ import annotations

import itertools
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from monarch.core.lowlevel import (
    BULK_PLANES_GROUP,
    MemoryPlane,
    MissingPlugin,
    PlaneError,
    Planes,
    PluginConflict,
)
from monarch.transport.testing import install_entry_points

_groups = itertools.count()

PLANES = """
from typing import Any, ClassVar

from monarch.core.lowlevel import Loan, Plane

LOG: list[tuple[str, str]] = []


class Near(Plane):
    name: ClassVar[str] = "near"
    order: ClassVar[int] = 5

    def lend(self, buffer_id: int, address: int, size: int) -> tuple[Any, ...]:
        return ("near", buffer_id)

    def release(self, buffer_id: int) -> None:
        LOG.append(("release", str(buffer_id)))

    def reaches(self, loan: Loan) -> bool:
        return loan.reach("near") is not None and loan.pid != 0

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        LOG.append(("read", "near"))

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        LOG.append(("write", "near"))
        return False  # cannot: the next plane writes


class Far(Plane):
    name: ClassVar[str] = "far"
    order: ClassVar[int] = 50

    def reaches(self, loan: Loan) -> bool:
        return True

    def read(self, loan: Loan, into: int, deadline: float) -> None:
        LOG.append(("read", "far"))

    def write(self, loan: Loan, source: int, size: int, deadline: float) -> bool:
        LOG.append(("write", "far"))
        return True


class NotAPlane:
    name = "bogus"
"""


@dataclass(frozen=True)
class FakeLoan:
    pid: int
    token: int = 1
    identity: int = 0
    cell: int = 0
    buffer_id: int = 1
    address: int = 0
    size: int = 0
    writable: bool = True
    gate: int = -1
    planes: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    def reach(self, plane: str) -> tuple[Any, ...] | None:
        return dict(self.planes).get(plane)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    module = f"bulk_planes_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(PLANES))
    (tmp_path / "module_name").write_text(module)
    return tmp_path


def fresh_group() -> str:
    return f"monarch.test_bulk_planes_{next(_groups)}"


def module_of(site: Path) -> str:
    return (site / "module_name").read_text()


def test_a_plane_registered_through_an_entry_point_is_found_and_asked_in_order(
    site: Path,
) -> None:
    group, module = fresh_group(), module_of(site)
    both = {"near": f"{module}:Near", "far": f"{module}:Far"}
    install_entry_points(site, "monarch-planes", group, both)
    planes = Planes(group)
    assert [p.name for p in planes.all()] == ["near", "memory", "far"]
    assert isinstance(planes.get("memory"), MemoryPlane)
    assert planes.lend(7, 0, 16) == (("near", ("near", 7)),)
    planes.release(7)
    log = __import__(module).LOG
    assert ("release", "7") in log


def test_one_plane_is_chosen_per_loan_and_a_write_falls_to_the_next(site: Path) -> None:
    group, module = fresh_group(), module_of(site)
    both = {"near": f"{module}:Near", "far": f"{module}:Far"}
    install_entry_points(site, "monarch-planes", group, both)
    planes = Planes(group)
    near = FakeLoan(pid=1, planes=(("near", ("near", 1)),))
    elsewhere = FakeLoan(pid=1)  # not lent through "near"; memory: not a readable process
    assert planes.choose(near).name == "near"
    assert planes.choose(elsewhere).name == "far"
    assert planes.choose(near) is planes.choose(near)  # kept: not asked again
    log = __import__(module).LOG
    log.clear()
    assert planes.write(near, 0, 0, 0.0).name == "far"
    assert log == [("write", "near"), ("write", "far")]
    planes.forget(near)


def test_a_missing_plane_names_the_wheel_to_install() -> None:
    planes = Planes(fresh_group())
    with pytest.raises(MissingPlugin, match=r"bulk-data plane 'tcp' needs the monarch-rdma wheel"):
        planes.get("tcp")
    with pytest.raises(MissingPlugin, match=r"bulk-data plane 'warp' is not installed"):
        planes.get("warp")


def test_a_plane_registered_twice_names_both_wheels(site: Path) -> None:
    group, module = fresh_group(), module_of(site)
    install_entry_points(site, "monarch-one", group, {"near": f"{module}:Near"})
    install_entry_points(site, "monarch-two", group, {"near": f"{module}:Far"})
    planes = Planes(group)
    with pytest.raises(PluginConflict, match=r"registered by monarch-(one|two) and monarch-"):
        planes.get("near")
    with pytest.raises(PluginConflict):
        planes.all()


def test_an_entry_point_that_is_not_a_plane_of_its_name_is_refused(site: Path) -> None:
    group, module = fresh_group(), module_of(site)
    install_entry_points(
        site,
        "monarch-bad",
        group,
        {"bogus": f"{module}:NotAPlane", "faraway": f"{module}:Far"},
    )
    planes = Planes(group)
    with pytest.raises(PlaneError, match=r"'bogus' .* is not a Plane class"):
        planes.get("bogus")
    with pytest.raises(PlaneError, match=r"entry point 'faraway' .* names the plane 'far'"):
        planes.get("faraway")


def test_no_plane_reaching_a_loan_is_an_error() -> None:
    planes = Planes(fresh_group())
    with pytest.raises(PlaneError, match=r"no bulk-data plane reaches the loan of process 1"):
        planes.choose(FakeLoan(pid=1))


def test_the_core_group_is_the_one_monarch_rdma_registers_in() -> None:
    assert BULK_PLANES_GROUP == "monarch.bulk_planes"
