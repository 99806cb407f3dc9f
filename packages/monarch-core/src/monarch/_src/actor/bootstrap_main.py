"""A proc's entry point under upstream's name (``python -m monarch._src.actor.bootstrap_main``,
the default ``BootstrapCommand``): the same as ``python -m monarch.core._host._proc``."""

from __future__ import annotations

from monarch.core._host._bootstrap import run_proc

if __name__ == "__main__":
    run_proc()
