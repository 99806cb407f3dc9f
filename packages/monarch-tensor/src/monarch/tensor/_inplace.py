"""The checks torch makes before an in-place op writes, which its meta kernels skip.

The controller learns an op's result by running it on meta tensors, so an error torch
raises at the call must come from there too (else the op is recorded, fails on every
worker, and a program that plain torch stops runs on with an unchanged tensor). torch
2.13's meta kernels miss two of TensorIterator's checks of an in-place op's output:

- the cast of the computed dtype to the written tensor's (``int_tensor.mul_(1.5)``:
  "result type Float can't be cast to the desired output type Long"); ``add_``/``sub_``
  and ``div_`` have them, ``mul_``, ``ldexp_``, ``logit_`` do not;
- internal overlap: writing a tensor whose elements share memory (``t.expand(2, 3).add_(1)``);

and, in- or out-of-place, subtraction's refusal of a bool operand (``t - True``).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable
from typing import Any

import torch

_DUNDERS = {
    "add": "add_",
    "sub": "sub_",
    "mul": "mul_",
    "truediv": "div_",
    "floordiv": "floor_divide_",
    "mod": "remainder_",
    "pow": "pow_",
    "and": "bitwise_and_",
    "or": "bitwise_or_",
    "xor": "bitwise_xor_",
    "lshift": "bitwise_left_shift_",
    "rshift": "bitwise_right_shift_",
}

ELEMENTWISE = frozenset(
    {
        "abs_",
        "absolute_",
        "acos_",
        "acosh_",
        "add_",
        "arccos_",
        "arccosh_",
        "arcsin_",
        "arcsinh_",
        "arctan2_",
        "arctan_",
        "arctanh_",
        "asin_",
        "asinh_",
        "atan2_",
        "atan_",
        "atanh_",
        "bernoulli_",
        "bitwise_and_",
        "bitwise_left_shift_",
        "bitwise_not_",
        "bitwise_or_",
        "bitwise_right_shift_",
        "bitwise_xor_",
        "cauchy_",
        "ceil_",
        "clamp_",
        "clamp_max_",
        "clamp_min_",
        "clip_",
        "copy_",
        "copysign_",
        "cos_",
        "cosh_",
        "deg2rad_",
        "digamma_",
        "div_",
        "divide_",
        "eq_",
        "erf_",
        "erfc_",
        "erfinv_",
        "exp2_",
        "exp_",
        "expm1_",
        "exponential_",
        "fix_",
        "floor_",
        "floor_divide_",
        "fmod_",
        "frac_",
        "gcd_",
        "ge_",
        "greater_",
        "greater_equal_",
        "gt_",
        "heaviside_",
        "hypot_",
        "i0_",
        "igamma_",
        "igammac_",
        "lcm_",
        "ldexp_",
        "le_",
        "less_",
        "less_equal_",
        "lgamma_",
        "log10_",
        "log1p_",
        "log2_",
        "log_",
        "log_normal_",
        "logical_and_",
        "logical_not_",
        "logical_or_",
        "logical_xor_",
        "logit_",
        "lt_",
        "mul_",
        "multiply_",
        "mvlgamma_",
        "nan_to_num_",
        "ne_",
        "neg_",
        "negative_",
        "nextafter_",
        "normal_",
        "not_equal_",
        "polygamma_",
        "pow_",
        "rad2deg_",
        "random_",
        "reciprocal_",
        "relu_",
        "remainder_",
        "round_",
        "rsqrt_",
        "sgn_",
        "sigmoid_",
        "sign_",
        "sin_",
        "sinc_",
        "sinh_",
        "sqrt_",
        "square_",
        "sub_",
        "subtract_",
        "tan_",
        "tanh_",
        "true_divide_",
        "trunc_",
        "uniform_",
        "xlogy_",
    }
)
"""The in-place ops that refuse an output with internal overlap on CPU (torch 2.13:
TensorIterator's ``check_mem_overlap``); ``fill_``, ``zero_`` and the ones that change
only metadata (``t_``, ``unsqueeze_``) do not."""

_verdicts: dict[Hashable, str | None] = {}
"""The cast error (or None) of each in-place op by what type promotion reads: the dtypes,
which tensors are 0-d, the Python scalars' types (never shapes alone)."""

_LIMIT = 4096


def check_inplace(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Raise torch's RuntimeError where ``func(*args, **kwargs)`` (meta tensors, already
    run without error) writes its first argument, or ``out=``, in a way plain torch
    refuses."""
    _check_sub(getattr(func, "__name__", ""), args)
    out = kwargs.get("out")
    if isinstance(out, torch.Tensor):  # meta kernels check the cast of ``out=``, not this
        if f"{getattr(func, '__name__', '')}_" in ELEMENTWISE:
            _check_overlap(out)
        return
    name = _in_place_name(getattr(func, "__name__", ""))
    if name is None or out is not None or not args or not isinstance(args[0], torch.Tensor):
        return
    if name in ELEMENTWISE:
        _check_overlap(args[0])
    error = _cast_error(name, args, kwargs)
    if error is not None:
        raise RuntimeError(error)


_SUBTRACTIONS = frozenset(
    {"sub", "sub_", "subtract", "subtract_", "rsub", "__sub__", "__rsub__", "__isub__"}
)


def _check_sub(name: str, args: tuple[Any, ...]) -> None:
    """torch's ``sub_check``, which its meta kernels lack: no bool operand."""
    if name not in _SUBTRACTIONS or len(args) < 2:
        return
    bools = [
        (isinstance(a, torch.Tensor) and a.dtype == torch.bool) or isinstance(a, bool)
        for a in args[:2]
    ]
    if all(bools):
        raise RuntimeError(
            "Subtraction, the `-` operator, with two bool tensors is not supported. "
            "Use the `^` or `logical_xor()` operator instead."
        )
    if any(bools):
        raise RuntimeError(
            "Subtraction, the `-` operator, with a bool tensor is not supported. "
            "If you are trying to invert a mask, use the `~` or `logical_not()` operator instead."
        )


def _check_overlap(written: torch.Tensor) -> None:
    """torch's ``assert_no_internal_overlap``: yes where a dimension of several elements has
    stride 0 (an ``expand``ed tensor)."""
    if any(n > 1 and s == 0 for n, s in zip(written.shape, written.stride(), strict=True)):
        raise RuntimeError(
            "unsupported operation: more than one element of the written-to tensor refers to "
            "a single memory location. Please clone() the tensor before performing the "
            "operation."
        )


def _in_place_name(name: str) -> str | None:
    """The ``Tensor`` method an in-place op is (``__imul__`` is ``mul_``), else None."""
    if name.startswith("__i") and name.endswith("__"):
        return _DUNDERS.get(name[3:-2])
    if name.endswith("_") and not name.startswith("_"):
        return name
    return None


def _cast_error(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """torch's message where the out-of-place op's result dtype cannot be cast to the
    written tensor's; None where it can, or where there is no such op to ask."""
    key = _key(name, args, kwargs)
    if key is not None and key in _verdicts:
        return _verdicts[key]
    verdict = _compute(name, args, kwargs)
    if key is not None:
        if len(_verdicts) >= _LIMIT:
            _verdicts.clear()
        _verdicts[key] = verdict
    return verdict


def _compute(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    out_of_place = getattr(torch.Tensor, name[:-1], None)
    if not callable(out_of_place):
        return None
    written = args[0]
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # ``resize`` is deprecated, say
            result = out_of_place(*args, **kwargs)
    except Exception:  # noqa: BLE001 - no answer from it: the in-place op's meta run decides
        return None
    if not isinstance(result, torch.Tensor) or result.shape != written.shape:
        return None
    if torch.can_cast(result.dtype, written.dtype):
        return None
    return (
        f"result type {_type_name(result.dtype)} can't be cast to the desired output type "
        f"{_type_name(written.dtype)}"
    )


def _key(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable | None:
    """What the result dtype depends on, or None (an argument that cannot be a key)."""
    parts: list[Any] = [name]
    for value in (*args, *sorted(kwargs.items())):
        parts.append(_describe(value))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _describe(value: Any) -> Any:
    if isinstance(value, (tuple, list)):  # a keyword argument's (name, value), a shape
        return (type(value), *(_describe(v) for v in value))
    if isinstance(value, torch.Tensor):
        return (value.dtype, value.dim() == 0)
    if isinstance(value, (bool, int, float, complex)):
        return type(value)
    return (type(value), value)


def _type_name(dtype: torch.dtype) -> str:
    """torch's C++ name of a dtype, as its messages say it (``Long`` for int64)."""
    return str(torch.empty((), dtype=dtype, device="meta").type()).rsplit(".", 1)[-1][:-6]
