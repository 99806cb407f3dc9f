"""A proc's Python stacks: py-spy's dump when installed, else the dump the proc takes of
itself (``monarch.core.inspect_proc(..., stacks=True)``).

py-spy reads a process from outside, so it sees a proc whose loop is held (an ``async
def`` endpoint that blocks, which also keeps the proc from answering) as well as any
other; it needs the proc on this machine and leave to trace it (root, or
``kernel.yama.ptrace_scope`` 0). Without it, or when it fails, the proc's own dump.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Final

from monarch.core import ThreadStack, current_config

PYSPY_TIMEOUT: Final = 10.0
"""Seconds a py-spy dump may take."""


def pyspy_path() -> str | None:
    """py-spy as the ``pyspy_bin`` key (``PYSPY_BIN``) says, else on PATH or beside this
    Python (pip installs it there); None if absent."""
    configured = current_config().pyspy_bin
    if configured:
        return shutil.which(configured)
    return shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))


def pyspy_dump(pid: int, program: str) -> list[dict[str, Any]]:
    """Every thread of process ``pid``, read by py-spy (``program``), as ``own_threads``
    writes them; raises ``RuntimeError`` saying why py-spy could not."""
    try:
        done = subprocess.run(
            [program, "dump", "--pid", str(pid), "--json"],
            capture_output=True,
            text=True,
            timeout=PYSPY_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"py-spy: {exc}") from None
    if done.returncode != 0:
        raise RuntimeError(f"py-spy: {(done.stderr or done.stdout).strip()[-500:]}")
    try:
        threads = json.loads(done.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"py-spy wrote no JSON: {exc}") from None
    return [
        {
            "name": thread.get("thread_name") or f"thread {thread.get('thread_id')}",
            "ident": thread.get("thread_id", 0),
            "daemon": False,
            "active": bool(thread.get("active", False)),
            "frames": [  # py-spy lists the innermost first
                {
                    "filename": frame.get("filename", ""),
                    "lineno": frame.get("line", 0),
                    "function": frame.get("name", ""),
                    "line": "",
                }
                for frame in reversed(thread.get("frames", []))
            ],
        }
        for thread in threads
    ]


def own_threads(stacks: list[ThreadStack]) -> list[dict[str, Any]]:
    """The stacks a proc took of itself, as JSON."""
    return [
        {
            "name": stack.name,
            "ident": stack.ident,
            "daemon": stack.daemon,
            "frames": [
                {"filename": f.filename, "lineno": f.lineno, "function": f.function, "line": f.line}
                for f in stack.frames
            ],
        }
        for stack in stacks
    ]
