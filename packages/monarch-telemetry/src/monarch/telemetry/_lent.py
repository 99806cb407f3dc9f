"""The names ``monarch.actor`` lends from this wheel (its ``monarch.actor`` entry points).

Importing it instruments the process: a script's ``from monarch.actor import span`` (at
its top, as upstream's users write it) instruments it before it spawns anything, so its
procs are instrumented too.
"""

from ._instrumentation import install
from ._meter import get_meter
from ._spans import span, traced

install()

__all__ = ["get_meter", "span", "traced"]
