"""An actor whose module calls ``sys.exit()`` at import, in procs told to (a script
imported as a module by mistake, a module that checks its environment and quits)."""

from __future__ import annotations

import os
import sys

from monarch.actor import Actor, endpoint

if os.environ.get("MONARCH_TEST_EXIT_AT_IMPORT"):
    sys.exit(3)


class Quits(Actor):
    @endpoint
    def ping(self) -> str:
        return "imported"
