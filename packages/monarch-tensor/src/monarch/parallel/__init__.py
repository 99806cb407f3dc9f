"""Upstream's ``monarch.parallel``: ``PipelineParallelism`` (pipeline stages on several
meshes, scheduled with its pipeline IR) and ``get_parameter_udf``. Not built here: the
names import, and using them raises ``NotImplementedError`` saying what is missing."""

from __future__ import annotations

from typing import Any, NoReturn

_MISSING = (
    "needs upstream's pipeline-parallel runtime (its pipeline IR schedules and the "
    "tensor engine's send/recv between stage meshes), which this project does not have: "
    "run the stages yourself, moving activations between meshes with Tensor.to_mesh"
)


class PipelineParallelism:
    """Upstream's pipeline-parallel trainer over ``meshes`` (one per stage)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"monarch.parallel.PipelineParallelism {_MISSING}")


def get_parameter_udf(*args: Any, **kwargs: Any) -> NoReturn:
    raise NotImplementedError(f"monarch.parallel.get_parameter_udf {_MISSING}")


__all__ = ["PipelineParallelism", "get_parameter_udf"]
