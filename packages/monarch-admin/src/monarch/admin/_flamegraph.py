"""A flame graph as a self-contained SVG (what Brendan Gregg's flamegraph.pl draws), from
"a;b;c" stacks and the time spent in each: the job's procs side by side at the bottom, each
frame as wide as the time spent in it and its callees; hover for the name and share."""

from __future__ import annotations

import hashlib
from html import escape
from typing import Final

WIDTH: Final = 1200
ROW: Final = 17
MIN_WIDTH: Final = 0.5
"""Frames narrower than this many pixels are left out (their time is in their parent's)."""
CHAR: Final = 7.0
"""Pixels a character of the 12px monospace font takes, for fitting labels."""


class _Node:
    __slots__ = ("children", "total")

    def __init__(self) -> None:
        self.total = 0.0
        self.children: dict[str, _Node] = {}


def flamegraph_svg(stacks: dict[str, float], title: str = "monarch profile") -> str:
    """The SVG of ``stacks`` (``outer;...;inner`` -> time in the inner frame itself)."""
    root = _Node()
    for path, spent in stacks.items():
        if spent <= 0:
            continue
        node = root
        node.total += spent
        for frame in path.split(";"):
            node = node.children.setdefault(frame, _Node())
            node.total += spent
    depth = _depth(root)
    height = (depth + 3) * ROW
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">',
        f'<rect width="{WIDTH}" height="{height}" fill="#f8f8f8"/>',
        f'<text x="{WIDTH / 2}" y="{ROW}" text-anchor="middle" font-size="14">'
        f"{escape(title)}</text>",
    ]
    if root.total > 0:
        scale = WIDTH / root.total
        _draw(parts, root, 0.0, height - 2 * ROW, scale, root.total)
    else:
        parts.append(f'<text x="10" y="{3 * ROW}">no samples</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _depth(node: _Node) -> int:
    return 1 + max((_depth(child) for child in node.children.values()), default=0)


def _draw(parts: list[str], node: _Node, x: float, y: float, scale: float, whole: float) -> None:
    for name, child in sorted(node.children.items()):
        width = child.total * scale
        if width >= MIN_WIDTH:
            share = 100 * child.total / whole
            label = name if len(name) * CHAR < width - 4 else name[: int((width - 4) / CHAR)]
            parts.append(
                f'<g class="frame"><title>{escape(name)} ({share:.1f}%)</title>'
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{ROW - 1}" '
                f'fill="{_colour(name)}" rx="2"/>'
                + (
                    f'<text x="{x + 2:.1f}" y="{y + ROW - 5:.1f}">{escape(label)}</text>'
                    if len(label) > 1
                    else ""
                )
                + "</g>"
            )
            _draw(parts, child, x, y - ROW, scale, whole)
        x += width


def _colour(name: str) -> str:
    """A warm colour that stays the same for the same frame."""
    digest = hashlib.blake2b(name.encode(), digest_size=3).digest()
    return f"rgb({205 + digest[0] % 50},{digest[1] % 180 + 40},{digest[2] % 55})"
