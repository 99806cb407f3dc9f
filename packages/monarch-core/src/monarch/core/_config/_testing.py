"""pytest helpers: run a test under several configurations, each inside ``configured(...)``.

pytest is imported only when a decorator is applied, so a program never needs it.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ._layers import check, configured

_F = TypeVar("_F", bound=Callable[..., Any])


def _values(values: Iterable[object]) -> list[object]:
    """A list of ``values``; sets sorted by repr so test ids are stable across runs."""
    if isinstance(values, set | frozenset):
        return sorted(values, key=repr)
    return list(values)


def _parametrize(cases: list[dict[str, object]]) -> Callable[[_F], _F]:
    """Parametrize a test over ``cases``, running each under ``configured(**case)``."""
    for case in cases:
        check(case)  # a typo fails at collection, not inside every case
    ids = ["-".join(f"{k}={v}" for k, v in case.items()) for case in cases]

    def decorator(fn: _F) -> _F:
        import pytest  # here, not at the top: only tests apply the decorator

        sig = inspect.signature(fn)
        arg = "_config_overrides"
        while arg in sig.parameters:  # stacked decorators each get their own argument
            arg += "_"
        params = list(sig.parameters.values())
        at = next(
            (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD),
            len(params),
        )
        # Keyword-only at the end: pytest passes it by name, and a method's ``self`` stays first.
        params.insert(at, inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY))
        wrapper: Any
        if inspect.iscoroutinefunction(fn):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with configured(**kwargs.pop(arg)):
                    return await fn(*args, **kwargs)

            wrapper = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                with configured(**kwargs.pop(arg)):
                    return fn(*args, **kwargs)

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, fn)
        wrapper.__signature__ = sig.replace(parameters=params)
        marked: _F = pytest.mark.parametrize(arg, cases, ids=ids)(wrapper)
        return marked

    return decorator


def parametrize_config(**config_options: Iterable[object]) -> Callable[[_F], _F]:
    """Run a test under every combination (cross product) of the given values.

    ``@parametrize_config(actor_queue_dispatch={True, False}, tail_log_lines={0, 10})`` runs the
    test 4 times, each inside ``configured(...)``; sync and async tests alike.
    """
    if not config_options:
        raise ValueError("parametrize_config requires at least one config option")
    keys = list(config_options)
    combos = itertools.product(*(_values(v) for v in config_options.values()))
    return _parametrize([dict(zip(keys, combo, strict=True)) for combo in combos])


def parametrize_config_pointwise(**config_options: Iterable[object]) -> Callable[[_F], _F]:
    """Run a test once per position: the i-th case uses the i-th value of every key (a zip).

    ``@parametrize_config_pointwise(a=[1, 2], b=[True, False])`` runs ``(a=1, b=True)`` and
    ``(a=2, b=False)``; every list must have the same length.
    """
    if not config_options:
        raise ValueError("parametrize_config_pointwise requires at least one config option")
    columns = {key: _values(values) for key, values in config_options.items()}
    lengths = {key: len(values) for key, values in columns.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"parametrize_config_pointwise needs equally long value lists: {lengths}")
    keys = list(columns)
    rows = zip(*columns.values(), strict=True)
    return _parametrize([dict(zip(keys, row, strict=True)) for row in rows])
