"""The baseline virtual environments of ``core_bench.py``: upstream torchmonarch and Ray.

``python benchmarks/baselines.py create`` (or ``hatch run bench:baselines``) makes

* ``benchmarks/.venvs/upstream``: ``torchmonarch==0.7.0`` and ``torch==2.13.0`` (torchmonarch
  imports torch without declaring it; the pin keeps pip from choosing a CUDA build), and
* ``benchmarks/.venvs/ray``: ``ray==2.60.0``,

each with the standard library's ``venv`` and pip. A venv that already has the pinned
versions is left alone, so running it again costs a few seconds. ``status`` tells what is
there. ``core_bench.py`` runs the same workloads in those interpreters when they exist
(``_actor_workloads.py`` for torchmonarch, ``_ray_workloads.py`` for Ray).

Only the standard library is used here, so any Python 3.11 can run it; the venvs are made
with that same interpreter (``--python`` picks another).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"


@dataclass(frozen=True)
class Baseline:
    name: str
    requirements: tuple[str, ...]
    """What pip installs, pinned."""
    check: str
    """A module whose import proves the venv works."""
    description: str


BASELINES: dict[str, Baseline] = {
    "upstream": Baseline(
        "upstream",
        ("torchmonarch==0.7.0", "torch==2.13.0"),
        "monarch.actor",
        "upstream Monarch (torchmonarch 0.7.0, torch 2.13.0)",
    ),
    "ray": Baseline("ray", ("ray==2.60.0",), "ray", "Ray 2.60.0"),
}


class BaselineError(RuntimeError):
    pass


def venv_dir(name: str) -> Path:
    return VENVS / name


def venv_python(name: str) -> Path:
    return venv_dir(name) / "bin" / "python"


def default_python(name: str) -> Path | None:
    """The baseline's interpreter when its venv exists (``create`` made it), else None."""
    python = venv_python(name)
    return python if python.exists() else None


def _pins(requirements: tuple[str, ...]) -> dict[str, str]:
    return {name: version for name, _, version in (r.partition("==") for r in requirements)}


def installed_versions(python: Path, names: list[str]) -> dict[str, str | None]:
    """Distribution versions in another interpreter's environment (None: not installed)."""
    code = (
        "import json, sys\n"
        "from importlib.metadata import version, PackageNotFoundError\n"
        "out = {}\n"
        "for n in sys.argv[1:]:\n"
        "    try:\n"
        "        out[n] = version(n)\n"
        "    except PackageNotFoundError:\n"
        "        out[n] = None\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run(
        [str(python), "-c", code, *names], capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        return dict.fromkeys(names)
    result: dict[str, str | None] = json.loads(proc.stdout)
    return result


def _matches(installed: str | None, pinned: str) -> bool:
    # torch's CPU wheels carry a local version: 2.13.0+cpu satisfies ==2.13.0
    return installed is not None and installed.split("+", 1)[0] == pinned


def is_ready(baseline: Baseline) -> bool:
    python = default_python(baseline.name)
    if python is None:
        return False
    pins = _pins(baseline.requirements)
    versions = installed_versions(python, list(pins))
    return all(_matches(versions[n], v) for n, v in pins.items())


def _run(cmd: list[str], what: str, timeout: float) -> None:
    print(f"$ {' '.join(cmd)}", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(cmd, timeout=timeout, stdout=sys.stderr, stderr=subprocess.PIPE)
    except subprocess.TimeoutExpired as exc:
        raise BaselineError(f"{what}: timed out after {timeout:.0f} s") from exc
    except OSError as exc:
        raise BaselineError(f"{what}: could not run {cmd[0]}: {exc}") from exc
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        tail = "\n    ".join(stderr.splitlines()[-15:]) or "(no output)"
        raise BaselineError(f"{what} failed (exit code {proc.returncode}):\n    {tail}")


def create(baseline: Baseline, python: str, force: bool, timeout: float) -> None:
    target = venv_dir(baseline.name)
    if force and target.exists():
        shutil.rmtree(target)
    if is_ready(baseline):
        print(f"{baseline.name}: ready ({target})", file=sys.stderr)
        return
    if not venv_python(baseline.name).exists():
        if target.exists():  # a broken or partial venv: start again
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        _run([python, "-m", "venv", str(target)], f"{baseline.name}: creating the venv", 300)
    pip = [str(venv_python(baseline.name)), "-m", "pip", "install", "--disable-pip-version-check"]
    _run(
        [*pip, *baseline.requirements],
        f"{baseline.name}: pip install {' '.join(baseline.requirements)}",
        timeout,
    )
    if not is_ready(baseline):
        raise BaselineError(f"{baseline.name}: installed, but the pinned versions are not there")
    proc = subprocess.run(
        [str(venv_python(baseline.name)), "-c", f"import {baseline.check}"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        tail = "\n    ".join(proc.stderr.strip().splitlines()[-8:])
        raise BaselineError(f"{baseline.name}: `import {baseline.check}` failed:\n    {tail}")
    print(f"{baseline.name}: ready ({target})", file=sys.stderr)


def status() -> dict[str, dict[str, object]]:
    out: dict[str, dict[str, object]] = {}
    for name, baseline in BASELINES.items():
        python = default_python(name)
        pins = _pins(baseline.requirements)
        versions = installed_versions(python, list(pins)) if python else {}
        out[name] = {
            "python": str(python) if python else None,
            "wanted": pins,
            "installed": versions,
            "ready": bool(python) and all(_matches(versions.get(n), v) for n, v in pins.items()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="make (or complete) the baseline venvs")
    c.add_argument(
        "--only", default=",".join(BASELINES), help=f"comma-separated: {', '.join(BASELINES)}"
    )
    c.add_argument(
        "--python", default=sys.executable, help="the interpreter the venvs are made from"
    )
    c.add_argument("--force", action="store_true", help="delete and make them again")
    c.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed per pip run")
    sub.add_parser("status", help="print which baselines are installed, as JSON")
    args = p.parse_args(argv)

    if args.command == "status":
        print(json.dumps(status(), indent=2))
        return 0
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(BASELINES))
    if unknown:
        p.error(f"unknown baseline {', '.join(unknown)}; choose from {', '.join(BASELINES)}")
    # pip in the new venvs must not pick up this environment's settings for another one
    os.environ.pop("PIP_REQUIRE_VIRTUALENV", None)
    os.environ.pop("VIRTUAL_ENV", None)
    failed = []
    for name in names:
        try:
            create(BASELINES[name], args.python, args.force, args.timeout)
        except BaselineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            failed.append(name)
    if failed:
        print(
            f"baselines not created: {', '.join(failed)}. core_bench.py runs without them "
            "(it then compares with the fixed upstream figures).",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
