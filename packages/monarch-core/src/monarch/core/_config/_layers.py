"""The four layers, lowest first: defaults < environment < TOML file < runtime (``configure``).

Environment and file are read once, at import (``reload_from_environment`` re-reads them),
because children get their configuration through the environment they are started with and
nothing should change under a running proc by itself. Every write drops the cached ``Config``
snapshot, so ``current_config()`` costs one attribute read while nothing changes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Final

from ._key import Key
from ._keys import KEYS, Config

_log = logging.getLogger("monarch.config")

CONFIG_FILE_ENV: Final = "MONARCH_CONFIG_FILE"
"""Environment variable naming the optional TOML file layer (top-level ``key = value`` pairs)."""

_DEFAULTS: Final[dict[str, Any]] = {name: key.default for name, key in KEYS.items()}


class _State:
    """The mutable layers (layer form); every write holds ``lock`` and drops the snapshot."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.env: dict[str, Any] = {}
        self.file: dict[str, Any] = {}
        self.runtime: dict[str, Any] = {}
        self.version = 0
        self.snapshot: Config | None = None

    def changed(self) -> None:
        """Call with ``lock`` held after any layer changed."""
        self.version += 1
        self.snapshot = None

    def merged(self) -> dict[str, Any]:
        """Call with ``lock`` held: the layer form of every key."""
        return {**_DEFAULTS, **self.env, **self.file, **self.runtime}


_state: Final = _State()


def check(overrides: Mapping[str, object]) -> dict[str, Any]:
    """Layer form of ``configure`` arguments; raises before anything is applied."""
    checked: dict[str, Any] = {}
    for name, value in overrides.items():
        key = KEYS.get(name)
        if key is None:
            raise ValueError(f"invalid configuration key: `{name}`")  # upstream's words
        checked[name] = key.check(value)
    return checked


def configure(**kwargs: object) -> None:
    """Set keys in the runtime layer (over defaults < environment < file).

    All-or-nothing, with upstream's errors: an unknown key raises ValueError ("invalid
    configuration key: ..."), a value of the wrong type TypeError (a zero where upstream needs
    a non-zero int ValueError), and then nothing changes. Durations take humantime strings
    (``"30s"``, ``"1h 30m"``) only, as upstream's (see ``Key.check``).
    """
    updates = check(kwargs)
    if updates:
        with _state.lock:
            _state.runtime.update(updates)
            _state.changed()


def get_global_config() -> dict[str, Any]:
    """Every key's merged value (defaults < env < file < runtime); a copy, safe to mutate."""
    with _state.lock:
        merged = _state.merged()
    return {name: KEYS[name].public(value) for name, value in merged.items()}


def get_runtime_config() -> dict[str, Any]:
    """Only the keys set with ``configure``; ``configure(**get_runtime_config())`` restores them."""
    with _state.lock:
        runtime = dict(_state.runtime)
    return {name: KEYS[name].public(value) for name, value in runtime.items()}


def clear_runtime_config() -> None:
    """Forget every ``configure`` override; environment, file and defaults stay."""
    with _state.lock:
        _state.runtime = {}
        _state.changed()


@contextlib.contextmanager
def configured(**overrides: object) -> Iterator[dict[str, Any]]:
    """Apply ``overrides`` for the block, yield the merged config, then restore the runtime layer.

    The restore happens even when the block raises. The runtime layer is process-global, so other
    threads see the overrides while the block runs: meant for tests and short scoped blocks.
    """
    with _state.lock:
        saved = dict(_state.runtime)
    try:
        configure(**overrides)
        yield get_global_config()
    finally:
        with _state.lock:
            _state.runtime = saved
            _state.changed()


def current_config() -> Config:
    """The merged configuration as a frozen ``Config``, rebuilt only after a change.

    Cheap enough to call per message: one attribute read while nothing changes.
    """
    snapshot = _state.snapshot
    if snapshot is not None:
        return snapshot
    with _state.lock:
        if _state.snapshot is None:
            fields: dict[str, Any] = {
                name: KEYS[name].snapshot(value) for name, value in _state.merged().items()
            }
            _state.snapshot = Config(**fields)
        return _state.snapshot


def config_version() -> int:
    """A counter that changes whenever any layer changes, for caches of derived values."""
    return _state.version


def runtime_env() -> dict[str, str]:
    """The runtime layer as environment variables, to start child processes with the same keys.

    In the child these land in its environment layer (below its own file layer, if any).
    """
    with _state.lock:
        runtime = dict(_state.runtime)
    return {KEYS[name].env[0]: KEYS[name].text(value) for name, value in runtime.items()}


def _read_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The environment layer; a bad value is logged and skipped: this runs at import."""
    layer: dict[str, Any] = {}
    for key in KEYS.values():
        value = _read_key(key, environ)
        if value is not _UNSET:
            layer[key.name] = value
    return layer


_UNSET: Final = object()

_KEYS_OF_VARIABLE: Final[dict[str, list[Key]]] = {}
"""Each environment variable a key reads, to the keys that read it."""
for _key in KEYS.values():
    for _var in _key.env:
        _KEYS_OF_VARIABLE.setdefault(_var, []).append(_key)
del _key, _var


def _read_key(key: Key, environ: Mapping[str, str]) -> Any:
    """``key``'s value from the first of its variables that ``environ`` sets and that
    parses (a bad value is logged and the next variable tried), else ``_UNSET``."""
    for var in key.env:
        raw = environ.get(var)
        if raw is None:
            continue
        try:
            return key.parse_text(raw)
        except ValueError as e:
            _log.warning(
                "ignoring environment variable %s=%r: %s (expected %s)",
                var,
                raw,
                e,
                key.type_name,
            )
    return _UNSET


def _read_file(path: str) -> dict[str, Any]:
    """The TOML file layer (top-level ``key = value``); problems are logged and skipped."""
    import tomllib  # only where a file is configured: not imported by every process

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        _log.warning("ignoring configuration file %s (from %s): %s", path, CONFIG_FILE_ENV, e)
        return {}
    layer: dict[str, Any] = {}
    for name, raw in data.items():
        key = KEYS.get(name)
        if key is None:
            _log.warning("ignoring unknown key %r in configuration file %s", name, path)
            continue
        try:
            value = key.parse_text(raw) if isinstance(raw, str) else key.coerce(raw)
        except ValueError as e:
            _log.warning(
                "ignoring %s = %r in configuration file %s: %s (expected %s)",
                name,
                raw,
                path,
                e,
                key.type_name,
            )
            continue
        layer[name] = value
    return layer


def reload_from_environment(environ: Mapping[str, str] | None = None) -> None:
    """Re-read the environment and file layers (``os.environ`` unless given); keeps runtime.

    Done once at import; call again after changing the environment (tests, embedding).
    """
    environ = os.environ if environ is None else environ
    env = _read_environment(environ)
    path = environ.get(CONFIG_FILE_ENV, "")
    file = _read_file(path) if path else {}
    with _state.lock:
        _state.env, _state.file = env, file
        _state.changed()


def refresh_environment(changed: Collection[str]) -> None:
    """``os.environ``'s variables ``changed`` were set or removed since the layers were
    read: re-read the keys they give, and the file layer if one is configured.

    A zygote's fork takes its request's environment, which differs from the zygote's in a
    few variables, mostly not configuration (its rank, its parent's address): re-reading
    all of it (~100 lookups of ``os.environ``, a few Python calls each) cost a fresh fork
    ~0.5 ms and ~115 page copies; a key the request does change (``wait_spin`` in a
    crowded spawn) still costs its parse."""
    keys = {key.name: key for var in changed for key in _KEYS_OF_VARIABLE.get(var, ())}
    path = os.environ.get(CONFIG_FILE_ENV, "")
    if not keys and not path and CONFIG_FILE_ENV not in changed:
        return
    file = _read_file(path) if path else {}
    with _state.lock:
        env = dict(_state.env)
        for name, key in keys.items():
            value = _read_key(key, os.environ)
            if value is _UNSET:
                env.pop(name, None)
            else:
                env[name] = value
        _state.env, _state.file = env, file
        _state.changed()


reload_from_environment()
