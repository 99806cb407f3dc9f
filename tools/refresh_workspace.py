"""Reinstall the workspace members of this hatch environment when their metadata changed.

Hatch installs the members editable once, when it creates an environment, and re-syncs only when
the dependency list changes: a member that gained an entry point (or a new module in its
metadata) stays stale in an environment that outlives the change, and its plug-ins are not
found. The scripts run this first; it costs nothing when no member's pyproject.toml changed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = Path(sys.prefix) / ".monarch-workspace-metadata"


def main() -> int:
    members = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
    digest = hashlib.sha256()
    for member in members:
        digest.update(member.name.encode() + b"\0" + (member / "pyproject.toml").read_bytes())
    stamp = digest.hexdigest()
    if STAMP.exists() and STAMP.read_text() == stamp:
        return 0
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps"]
    for member in members:
        command += ["-e", str(member)]
    subprocess.run(command, check=True)
    STAMP.write_text(stamp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
