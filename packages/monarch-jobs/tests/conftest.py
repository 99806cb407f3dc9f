"""monarch-jobs tests: helpers shared by several files (jobkit.py) are imported by name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
