"""Run chosen test files under upstream torchmonarch 0.7.0, to prove what they expect is upstream's.

    python integration/upstream_check.py [--python PATH] TEST_FILE... [PYTEST_ARGS]

Drop-in tests use only the public API, so the same file runs against either implementation.
Here it runs in the upstream interpreter (``--python``, else ``$MONARCH_UPSTREAM_PYTHON``,
else ``benchmarks/.venvs/upstream/bin/python``, which ``hatch run bench:baselines`` makes),
with ``-p no:cacheprovider`` and without the tests marked ``ours_only`` (behaviour upstream
lacks, or checks through our internals). Arguments after the files go to pytest.

pytest (and hypothesis, for property tests) is not in upstream's venv and is not added to
it: the first run installs the versions this interpreter has into
``benchmarks/.venvs/upstream-pytest`` (``pip --target``), which the upstream interpreter then
finds through ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "benchmarks" / ".venvs" / "upstream-pytest"
PYTEST_PACKAGES = ("pytest", "pytest-timeout", "hypothesis")


def upstream_python(given: str | None) -> Path:
    candidate = given or os.environ.get("MONARCH_UPSTREAM_PYTHON")
    python = Path(candidate) if candidate else ROOT / "benchmarks/.venvs/upstream/bin/python"
    if not python.exists():
        sys.exit(
            f"no upstream interpreter at {python}: run `hatch run bench:baselines`, "
            "or give --python / MONARCH_UPSTREAM_PYTHON"
        )
    return python


def pins() -> list[str]:
    """The pytest packages at the versions this interpreter runs (any, where it has none)."""
    out = []
    for name in PYTEST_PACKAGES:
        try:
            out.append(f"{name}=={version(name)}")
        except PackageNotFoundError:
            out.append(name)
    return out


def ensure_pytest(python: Path) -> None:
    """pytest for the upstream interpreter, beside its venv rather than in it."""
    stamp = TOOLS / ".pins"
    wanted = " ".join(pins())
    if stamp.exists() and stamp.read_text() == wanted:
        return
    install = ["-m", "pip", "install", "-q", "--upgrade", "--target", str(TOOLS)]
    subprocess.run([str(python), *install, *wanted.split()], check=True)
    stamp.write_text(wanted)


def main(argv: list[str]) -> int:
    """``[--python PATH] PYTEST_ARGS...``: the files to run and any other pytest arguments."""
    given = None
    if argv[:1] == ["--python"] and len(argv) > 1:
        given, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    python = upstream_python(given)
    ensure_pytest(python)
    env = {**os.environ, "PYTHONPATH": str(TOOLS)}
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", "-m", "not ours_only"]
    return subprocess.run([*command, *argv], cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
