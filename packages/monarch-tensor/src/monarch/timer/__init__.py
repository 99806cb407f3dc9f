"""``monarch.timer``: how long sections of a program take, measured where they run (upstream's
``ExecutionTimer``; ``monarch.timer.remote_execution_timer`` has the remote functions that
run it on every proc of a mesh)."""

from .execution_timer import (
    ExecutionTimer,
    execution_timer_start,
    execution_timer_stop,
    get_execution_timer_average_ms,
    get_execution_timer_summary,
    get_latest_timer_measurement,
    get_time_perfcounter,
)

__all__ = [
    "ExecutionTimer",
    "execution_timer_start",
    "execution_timer_stop",
    "get_execution_timer_average_ms",
    "get_execution_timer_summary",
    "get_latest_timer_measurement",
    "get_time_perfcounter",
]
