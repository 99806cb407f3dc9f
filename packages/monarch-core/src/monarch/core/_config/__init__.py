"""Monarch's layered configuration: typed keys, four layers and a cached snapshot.

Layers, lowest to highest: defaults < environment variables (``HYPERACTOR_*``, ``MONARCH_*``) <
TOML file (path in ``MONARCH_CONFIG_FILE``) < runtime (``configure``); ``current_config()`` is
their merge as a frozen ``Config``, cached until a layer changes.

- ``_units``: humantime durations and byte sizes;
- ``_keys``: ``Config``, one annotated field per key, and its coercion (msgspec);
- ``_layers``: the layers, ``configure`` and the snapshot;
- ``_testing``: pytest helpers.

A new key is one field of ``Config`` in ``_keys.py`` (type, default, environment variable and
doc); nothing else changes. This module only re-exports.
"""

from ._key import BindSpec, Encoding, Key
from ._keys import KEYS, Config
from ._layers import (
    CONFIG_FILE_ENV,
    check,
    clear_runtime_config,
    config_version,
    configure,
    configured,
    current_config,
    get_global_config,
    get_runtime_config,
    refresh_environment,
    reload_from_environment,
    runtime_env,
)
from ._layers import check as _check  # the old name, until its callers switch to ``check``
from ._testing import parametrize_config, parametrize_config_pointwise
from ._units import format_duration, parse_byte_size, parse_duration

__all__ = [
    "CONFIG_FILE_ENV",
    "KEYS",
    "BindSpec",
    "Config",
    "Encoding",
    "Key",
    "_check",
    "check",
    "clear_runtime_config",
    "config_version",
    "configure",
    "configured",
    "current_config",
    "format_duration",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
    "parse_byte_size",
    "parse_duration",
    "refresh_environment",
    "reload_from_environment",
    "runtime_env",
]
