"""Layered runtime configuration and ``configure()`` (upstream's ``monarch.config``).

Layers, lowest to highest: defaults < environment variables < TOML file (``MONARCH_CONFIG_FILE``)
< runtime (``configure``). The implementation lives in ``monarch.core._config``.
"""

from monarch.core._config import (
    Encoding,
    clear_runtime_config,
    configure,
    configured,
    get_global_config,
    get_runtime_config,
    parametrize_config,
    parametrize_config_pointwise,
)

__all__ = [
    "Encoding",
    "clear_runtime_config",
    "configure",
    "configured",
    "get_global_config",
    "get_runtime_config",
    "parametrize_config",
    "parametrize_config_pointwise",
]
