"""``python -m monarch.core``: the ``monarch`` command, where its script is not on ``PATH``."""

import sys

from ._command._cli import main

if __name__ == "__main__":
    sys.exit(main())
