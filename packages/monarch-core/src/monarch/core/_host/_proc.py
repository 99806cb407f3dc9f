"""Entry point of a worker proc: ``python -m monarch.core._host._proc``, started by a host agent
(see ``_bootstrap``, which reads the proc's job from its environment and serves)."""

from __future__ import annotations

from ._bootstrap import run_proc

if __name__ == "__main__":
    run_proc()
