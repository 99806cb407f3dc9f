"""``monarch query "SQL"``: SQL over a live job's telemetry tables, printed as a table.

The tables live in the job's client (monarch-telemetry's ``enable_telemetry()``); its admin
server answers ``/v1/query``. The server is the one serving the job of this folder's
active ``monarch context`` (else this user's newest one here, said on stderr), as for
``monarch top``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from ._client import AdminError, add_server_options, found_server

MAX_CELL = 60
"""Characters of a cell shown in the table (``--json`` gives whole values)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run SQL over a live job's telemetry tables (through its admin server)",
        description="Run SQL over the telemetry tables of the job of this folder's active "
        "monarch context (its client's enable_telemetry()), through its admin server; print "
        "the rows as a table. The tables and their columns: monarch-telemetry's README.",
    )
    parser.add_argument("sql", metavar="SQL", help='a query, such as "SELECT * FROM actors"')
    parser.add_argument("--json", action="store_true", help="print the rows as JSON lines")
    add_server_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.sql.strip():
        print('monarch query: no SQL given: monarch query "SELECT ..."', file=sys.stderr)
        return 2
    client = found_server(args, "query")
    if client is None:
        return 2
    try:
        answer = client.get("/v1/query?sql=" + quote(args.sql, safe=""))
    except AdminError as exc:
        print(f"monarch query: {exc}", file=sys.stderr)
        return 1
    rows: list[dict[str, Any]] = answer.get("rows", [])
    if args.json:
        for row in rows:
            print(json.dumps(row, default=str))
    else:
        print(text_table(rows), end="")
    return 0


def text_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows (dicts of one shape) as aligned columns under a header, with the row count."""
    if not rows:
        return "(0 rows)\n"
    columns = list(rows[0])
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)).rstrip() + "\n"

    body = "".join(line(r) for r in cells)
    count = f"({len(rows)} row{'s' if len(rows) != 1 else ''})\n"
    return line(columns) + line(["-" * w for w in widths]) + body + count


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", "\\n")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
