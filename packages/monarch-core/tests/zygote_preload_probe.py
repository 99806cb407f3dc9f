"""A module test_zygote asks zygotes to preload: it remembers which process imported it."""

import os

IMPORTED_BY = os.getpid()
