"""A module test_zygote asks zygotes to preload: it registers a ``weakref.finalize`` at
its import, as torch does for each operator library it defines."""

import os
import weakref

PATH = [""]
"""Where a finalizer says it ran (set in the proc that arms it)."""


def write(path: str, kind: str) -> None:
    with open(os.path.join(path, f"{kind}.{os.getpid()}"), "w"):
        pass


class _Kept:
    pass


KEPT = _Kept()


def _at_exit() -> None:
    if PATH[0]:
        write(PATH[0], "zygote")


weakref.finalize(KEPT, _at_exit)
