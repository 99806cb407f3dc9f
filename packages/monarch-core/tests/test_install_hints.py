"""Names that resolve: hints give the command that works (the wheels are not on the index
yet), a core-only install says which wheel brings what, and upstream's torchmonarch in the
same environment is noticed."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import monarch
from monarch import _wheels

CHECKOUT = Path(monarch.__file__).resolve().parents[4]
PACKAGES = CHECKOUT / "packages"


def project(wheel: str) -> dict[str, object]:
    data = tomllib.loads((PACKAGES / wheel / "pyproject.toml").read_text())
    return dict(data["project"])


def test_the_tables_are_the_pyprojects() -> None:
    for wheel, siblings in _wheels.SIBLINGS.items():
        requires = [str(r).split("[")[0].split("=")[0] for r in project(wheel)["dependencies"]]  # type: ignore[attr-defined]
        assert set(siblings) == {r for r in requires if r in _wheels.SIBLINGS}, wheel
    for command, wheel in _wheels.COMMANDS.items():
        points = project(wheel)["entry-points"]
        assert command in points["monarch.commands"], (command, wheel)  # type: ignore[index]
    for module, wheel in _wheels.MODULES.items():
        assert (PACKAGES / wheel / "src" / Path(*module.split("."))).is_dir(), module


def installed(wheel: str) -> bool:
    try:
        importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def editable(*wheels: str) -> str:
    """``-e PATH`` for each of ``wheels`` not installed here, and the last one always."""
    needed = [w for w in wheels if w == wheels[-1] or not installed(w)]
    return " ".join(f"-e {PACKAGES}/{wheel}" for wheel in needed)


def test_a_hint_installs_from_the_checkout_with_the_missing_siblings() -> None:
    hint = _wheels.install_hint("monarch-telemetry", "sql")
    assert hint == (
        f'pip install -e "{PACKAGES}/monarch-telemetry[sql]" (monarch-telemetry is not on the '
        "package index yet: the name is reserved for this project)"
    )
    jobs = editable("monarch-telemetry", "monarch-admin", "monarch-jobs")
    assert _wheels.install_hint("monarch-jobs").startswith(f"pip install {jobs} (")


def run_without(wheels: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a Python whose path lacks the (editable) sources of ``wheels``: as an
    environment where only the others are installed."""
    hidden = [str(PACKAGES / wheel / "src") for wheel in wheels]
    prologue = f"import sys; sys.path[:] = [p for p in sys.path if p not in {hidden!r}]\n"
    return subprocess.run(
        [sys.executable, "-c", prologue + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_core_only_install_says_which_wheel_brings_monarch_job() -> None:
    done = run_without(
        ["monarch-jobs"],
        """
        import importlib.util
        assert importlib.util.find_spec("monarch.job") is None  # a probe still gets None
        import monarch.job
        """,
    )
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "ModuleNotFoundError: No module named 'monarch.job': it ships in the monarch-jobs "
        f"wheel; pip install {editable('monarch-telemetry', 'monarch-admin', 'monarch-jobs')} "
        "(monarch-jobs is not on the package index yet: the name is reserved for this project)"
    )


def test_a_core_only_install_says_which_wheel_brings_monarch_top() -> None:
    done = run_without(
        ["monarch-admin"],
        """
        from monarch.core._command._cli import main
        sys.exit(main(["top"]))
        """,
    )
    assert done.returncode == 2
    assert "invalid choice" not in done.stderr
    assert (
        "monarch: 'top' is a command of the monarch-admin wheel, which is not installed here: "
        f"pip install -e {PACKAGES}/monarch-admin (monarch-admin is not on the package index"
    ) in done.stderr


def upstream_install(folder: Path) -> Path:
    """What pip leaves of torchmonarch 0.7.0 in ``folder`` (a site-packages): its
    ``monarch`` package (a file of its own among them) and its metadata."""
    (folder / "monarch").mkdir(parents=True)
    (folder / "monarch" / "__init__.py").write_text("UPSTREAM = True\n")
    (folder / "monarch" / "bootstrap_main.py").write_text("")
    info = folder / "torchmonarch-0.7.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torchmonarch\nVersion: 0.7.0\n")
    return folder


def test_upstreams_torchmonarch_shadowing_this_monarch_is_said_at_import(tmp_path: Path) -> None:
    """Upstream's package wins (it comes first on sys.path, as site-packages does before an
    editable checkout): none of this project's ``monarch`` runs, monarch-core's .pth warns."""
    site_packages = upstream_install(tmp_path)
    code = f"""
        import site, warnings
        warnings.simplefilter("always")
        site.addsitedir({str(PACKAGES / "monarch-core" / "src")!r})  # its .pth, as at start
        sys.path.insert(0, {str(site_packages)!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import monarch
        assert monarch.UPSTREAM
        print(caught[0].category.__name__, caught[0].message)
        """
    done = run_without([], code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "RuntimeWarning upstream's torchmonarch is installed in this environment too "
        f"({site_packages}/monarch): it and this project both install the `monarch` package"
    )
    assert "pip uninstall torchmonarch" in done.stdout


def test_monarch_version_says_when_torchmonarch_is_installed_too(tmp_path: Path) -> None:
    site_packages = upstream_install(tmp_path)
    code = f"""
        sys.path.append({str(site_packages)!r})
        from monarch.core._command._cli import main
        sys.exit(main(["version"]))
        """
    done = run_without([], code)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("monarch 0.1.0")
    assert (
        "monarch: warning: upstream's torchmonarch is installed in this environment too "
        f"(torchmonarch 0.7.0 in {site_packages}): it and this project"
    ) in done.stderr
