"""monarch-core's pytest plugin (its ``pytest11`` entry point): the fixtures the wheels' tests
share; their helpers are in ``monarch.core.testing``.

Every pytest run of an environment with monarch-core loads this module, the transport's tests
and a user's own too: so it lives outside ``monarch.core`` (whose import starts the runtime's
machinery, registers plug-in groups and takes a second or two) and imports it only when a
fixture that needs it runs. Nothing here is autouse: a folder's ``conftest.py`` opts in, for
every test of the folder, with::

    @pytest.fixture(autouse=True)
    def _recorded(unhandled_failures: Failures) -> None:
        pass  # every test records the failures that reach the client unhandled
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from monarch.core import MeshFailure
    from monarch.core.testing import Failures


class _Recorder:
    """The one fault hook of a pytest process: it records into the running test's
    ``Failures``. One for the session: a failure from a test that just ended must not reach
    the default hook (which ends the client) between two tests or two modules, and two
    folders' tests in one process (an xdist worker) must not replace each other's hook."""

    def __init__(self, kind: type[Failures]) -> None:
        self.new = kind
        self.sink = kind()

    def __call__(self, failure: MeshFailure) -> None:
        self.sink.record(failure)


@pytest.fixture(scope="session")
def _monarch_fault_recorder() -> Iterator[_Recorder]:
    """Installs the recorder as ``monarch.actor.unhandled_fault_hook`` for the rest of the
    session, from the first test that asks for ``unhandled_failures``."""
    # imported here, not above: only a session whose tests use the runtime pays for it
    actor: Any = importlib.import_module("monarch.actor")
    testing: Any = importlib.import_module("monarch.core.testing")
    recorder = _Recorder(testing.Failures)
    default = actor.unhandled_fault_hook
    actor.unhandled_fault_hook = recorder
    yield recorder
    actor.unhandled_fault_hook = default


@pytest.fixture
def unhandled_failures(_monarch_fault_recorder: _Recorder) -> Failures:
    """Failures that reached the client unhandled while this test ran (a late one from the
    test before may land here too: assert on your own meshes' names)."""
    failures = _monarch_fault_recorder.new()
    _monarch_fault_recorder.sink = failures
    return failures
