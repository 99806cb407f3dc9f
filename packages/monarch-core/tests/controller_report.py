"""How the controller scripts the tests run report to them: one JSON object per stdout line,
and what a ``Future.get`` did, timed (shared by ``fault_controller`` and
``remote_controller``)."""

from __future__ import annotations

import json
import time
from typing import Any


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def outcome(future: Any, timeout: float) -> dict[str, Any]:
    """What ``future.get`` did (value, or error type and text), how long, and when."""
    start = time.monotonic()
    try:
        value = future.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        now = time.monotonic()
        return {
            "error": type(exc).__name__,
            "message": str(exc),
            "seconds": round(now - start, 3),
            "at": now,
        }
    now = time.monotonic()
    return {"value": value, "seconds": round(now - start, 3), "at": now}
