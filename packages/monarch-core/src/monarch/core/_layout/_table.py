"""``ProcMesh.to_table()``: a mesh's procs as upstream draws them, ``host.gpu[i]`` in a grid.

Upstream renders the device mesh of its tensor engine with ``tabulate`` (``grid`` format,
right-aligned) and names the axes around it; this draws the same text without either.
"""

from __future__ import annotations

from collections.abc import Sequence

MIN_PADDING = 2
"""What tabulate adds to a header's width for the least width of its column."""


def mesh_table(
    labels: Sequence[str], sizes: Sequence[int], ranks: Sequence[int], gpus_per_host: int
) -> str:
    """The grid of ``ranks`` (row-major over ``sizes``), each ``host.gpu[i]``, as upstream's
    ``to_table``: one to three dimensions; a third becomes one grid per index."""
    ndim = len(sizes)
    if not 1 <= ndim <= 3:
        raise ValueError("Input tensor must be 1D, 2D, or 3D")
    cells = [f"{r // gpus_per_host}.gpu[{r % gpus_per_host}]" for r in ranks]
    depth, rows, cols = ([1] * (3 - ndim) + list(sizes))[-3:]
    axis = [[str(i) for i in range(size)] for size in sizes]
    names = list(labels)
    col_name = names[-1]
    row_name = names[-2] if ndim > 1 else None
    row_labels = axis[-2] if ndim > 1 else ["1"]
    tables = []
    for d in range(depth):
        block = cells[d * rows * cols : (d + 1) * rows * cols]
        data = [block[r * cols : (r + 1) * cols] for r in range(rows)]
        if ndim > 1:
            data = [[row_labels[i], *row] for i, row in enumerate(data)]
            headers = ["", *axis[-1]]
        else:
            headers = list(axis[-1])
        lines = _grid(headers, data).split("\n")
        if d == 0:
            if ndim == 1:
                lines.insert(0, f"{col_name:^{len(lines[0])}}")
            else:
                y_width = max(len(label) for label in row_labels) + 4
                data_width = len(lines[0]) - y_width
                lines.insert(0, f"{' ' * y_width}{col_name:^{data_width}}")
        if row_name is not None:
            first = 1 if d == 0 else 0
            body = lines[first:]
            width = len(row_name)
            if d == 0:
                lines[0] = f"{' ' * (width + 2)}{lines[0]}"
            for i, line in enumerate(body):
                prefix = f"{row_name:>{width}} │" if i == len(body) // 2 else f"{' ' * width} │"
                lines[i + first] = prefix + line
        header = ""
        if ndim == 3:
            header = f"{names[0]}: {axis[0][d]}\n"
            if d > 0:
                header = "\n" + header
        tables.append(header + "\n".join(lines))
    return "\n".join(tables)


def _grid(headers: list[str], rows: list[list[str]]) -> str:
    """tabulate's ``grid`` format, every column right-aligned."""
    widths = [
        max([len(h) + MIN_PADDING, *(len(row[c]) for row in rows)]) for c, h in enumerate(headers)
    ]

    def rule(fill: str) -> str:
        return "+" + "+".join(fill * (w + 2) for w in widths) + "+"

    def line(cells: Sequence[str]) -> str:
        padded = (f"{cell:>{w}}" for cell, w in zip(cells, widths, strict=True))
        return "| " + " | ".join(padded) + " |"

    out = [rule("-"), line(headers), rule("=")]
    for row in rows:
        out += [line(row), rule("-")]
    return "\n".join(out)


def gpus_per_host(sizes: dict[str, int]) -> int:
    """What upstream's table divides ranks by: the mesh's ``gpus`` size (1 without one)."""
    return sizes.get("gpus", 1) or 1
