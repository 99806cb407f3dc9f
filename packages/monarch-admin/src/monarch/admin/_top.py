"""``monarch top``: a live terminal view of a job, from its admin server.

A tree of hosts, their procs (state, CPU, RSS) and the procs' actors (state, messages
per second, queue depth, the endpoint running and for how long), refreshed every
``--interval`` seconds; a failed actor shows in red with its error, a proc that does not
answer in orange. Enter (or ``s``) on a proc or an actor shows the proc's Python stacks,
the actor's thread first; ``b`` jumps to the actor busy the longest (a stuck one) and
shows its stack, ``f`` to the next failure; ``w`` widens the side pane for long stacks.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any, ClassVar

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.widgets import Footer, Header, Static, Tree
from textual.widgets.tree import TreeNode

from ._client import AdminClient, AdminError, add_server_options, found_server
from ._view import last_line

BAD: dict[str, str] = {
    "failed": "bold red",
    "died": "bold red",
    "lost": "red",
    "not answering": "bold dark_orange",
    "stopped": "grey50",
    "starting": "cyan",
}


def _mib(value: int | None) -> str:
    return "" if value is None else f"{value / 1048576:.0f} MiB"


def host_label(host: dict[str, Any]) -> Text:
    return Text.assemble(("host ", "bold"), host["hostname"], ("  " + host["address"], "grey50"))


def proc_label(proc: dict[str, Any]) -> Text:
    cpu = proc.get("cpu_percent")
    text = Text.assemble(
        (f"{proc['mesh']}[{proc['rank']}] ", "bold"),
        (proc["state"], BAD.get(proc["state"], "green")),
        f"  cpu {cpu:.0f}%" if cpu is not None else "",
        f"  rss {_mib(proc.get('rss'))}" if proc.get("rss") is not None else "",
        (f"  pid {proc['pid']}", "grey50"),
    )
    if proc["error"] and proc["state"] != "stopped":
        text.append("  " + proc["error"].splitlines()[0][:100], BAD.get(proc["state"], ""))
    return text


def actor_label(actor: dict[str, Any]) -> Text:
    """State first, then what it does: a narrow tree still shows what matters."""
    state = actor["state"]
    text = Text.assemble(
        (f"{actor['mesh']} {actor['point']} ", "bold"), (state, BAD.get(state, "green"))
    )
    if actor["current"]:
        busy = actor["busy_for"]
        text.append(f"  in {actor['current']} for {busy:.1f}s", "bold yellow" if busy >= 5 else "")
    if actor["error"] and state == "failed":
        text.append("  " + last_line(actor["error"])[:120], "red")
    text.append(f"  {actor['rate']:.1f} msg/s  queued {actor['queued']}")
    text.append(f"  handled {actor['handled']}")
    text.append(f"  {actor['class_name'].rpartition('.')[2]}", "grey50")
    return text


class TopApp(App[None]):
    """The terminal view (see the module docstring)."""

    TITLE = "monarch top"
    CSS = """
    #status { height: 1; padding: 0 1; background: $boost; }
    #tree { width: 3fr; }
    #side { width: 2fr; min-width: 40; border-left: solid $primary; }
    #tree.narrow { width: 1fr; }
    #side.wide { width: 3fr; }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("r", "refresh", "refresh"),
        Binding("s", "stacks", "stacks"),
        Binding("b", "busiest", "busiest actor"),
        Binding("f", "failure", "next failure"),
        Binding("w", "widen", "wide stacks"),
    ]

    def __init__(self, client: AdminClient, interval: float = 1.0) -> None:
        super().__init__()
        self.client = client
        self.interval = interval
        self.snapshot: dict[str, Any] | None = None
        self.items: dict[str, tuple[str, dict[str, Any]]] = {}
        """The latest snapshot's nodes by reference: (kind, node)."""
        self.nodes: dict[str, TreeNode[str]] = {}
        self.detail = ""
        """What the side pane shows, as plain text (for tests and copying)."""
        self.error = ""
        self._failure_index = 0
        self._fetching = False
        """Whether a snapshot is being asked for."""

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("connecting...", id="status")
        with Horizontal():
            tree: Tree[str] = Tree("job", id="tree")
            tree.show_root = False
            yield tree
            with VerticalScroll(id="side"):
                yield Static("Select a proc or an actor; Enter shows its stacks.", id="detail")
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = self.client.addr
        self.set_interval(self.interval, self.action_refresh)
        self.action_refresh()

    # -- the snapshot -------------------------------------------------------------------

    def action_refresh(self) -> None:
        """Ask for a snapshot, unless one is being asked for: a snapshot takes as long as
        the server waits on a proc that does not answer (its timeout, 2 s by default), longer
        than the interval; cancelling it for a new one would show nothing from then on."""
        if self._fetching:
            return
        self._fetching = True
        self.run_worker(self._fetch(), group="snapshot")

    async def _fetch(self) -> None:
        status = self.query_one("#status", Static)
        try:
            snap = await asyncio.to_thread(self.client.snapshot)
        except AdminError as exc:
            self.error = str(exc)
            status.update(Text(f"admin server: {exc} (retrying)", "bold red"))
            return
        finally:
            self._fetching = False
        self.error = ""
        self.show(snap)
        s = snap["summary"]
        line = Text(
            f"{s['hosts']} hosts  {s['procs']} procs  {s['actors']} actors  ",
        )
        line.append(f"{s['failed']} failed  ", "bold red" if s["failed"] else "")
        orange = "bold dark_orange" if s["not_answering"] else ""
        line.append(f"{s['not_answering']} not answering  ", orange)
        line.append(f"{s['died']} died", "bold red" if s["died"] else "")
        status.update(line)

    def show(self, snap: dict[str, Any]) -> None:
        """Bring the tree up to ``snap``, keeping what is open and where the cursor is."""
        self.snapshot = snap
        tree = self.query_one("#tree", Tree)
        seen: set[str] = set()
        items: dict[str, tuple[str, dict[str, Any]]] = {}

        def place(parent: TreeNode[str], ref: str, label: Text, leaf: bool) -> TreeNode[str]:
            seen.add(ref)
            node = self.nodes.get(ref)
            if node is None:
                if leaf:
                    node = parent.add_leaf(label, data=ref)
                else:
                    node = parent.add(label, data=ref, expand=True)
                self.nodes[ref] = node
            else:
                node.set_label(label)
            return node

        for host in snap["hosts"]:
            items[host["ref"]] = ("host", host)
            host_node = place(tree.root, host["ref"], host_label(host), False)
            for proc in host["procs"]:
                items[proc["ref"]] = ("proc", proc)
                proc_node = place(host_node, proc["ref"], proc_label(proc), False)
                for actor in proc["actors"]:
                    items[actor["ref"]] = ("actor", actor)
                    place(proc_node, actor["ref"], actor_label(actor), True)
        for ref in list(self.nodes):
            if ref not in seen:
                node = self.nodes.pop(ref)
                try:
                    node.remove()
                except Exception:  # noqa: BLE001 - its parent went first
                    pass
        self.items = items
        if not tree.cursor_node and tree.root.children:
            tree.move_cursor(tree.root.children[0])

    # -- the side pane ------------------------------------------------------------------

    def set_detail(self, text: Text | str) -> None:
        self.detail = text.plain if isinstance(text, Text) else text
        self.query_one("#detail", Static).update(text)

    def on_tree_node_highlighted(self, event: Tree.NodeHighlighted[str]) -> None:
        ref = event.node.data
        if ref is None or ref not in self.items:
            return
        kind, item = self.items[ref]
        lines = Text()
        lines.append(f"{kind} {ref}\n\n", "bold")
        for key, value in item.items():
            if key in ("procs", "actors", "ref", "error"):
                continue
            lines.append(f"{key}: {value}\n")
        if item.get("error"):
            lines.append("\nerror:\n", "bold red")
            lines.append(item["error"] + "\n", "red")
        if kind != "host":
            lines.append("\nEnter or s: its stacks", "grey50")
        self.set_detail(lines)

    def on_tree_node_selected(self, event: Tree.NodeSelected[str]) -> None:
        if event.node.data is not None:
            self.show_stacks(event.node.data)

    def action_stacks(self) -> None:
        node = self.query_one("#tree", Tree).cursor_node
        if node is not None and node.data is not None:
            self.show_stacks(node.data)

    def show_stacks(self, ref: str) -> None:
        kind, item = self.items.get(ref, ("", {}))
        if kind not in ("proc", "actor"):
            return
        self.set_detail(Text(f"asking {ref} for its stacks...", "grey50"))
        work = self._stacks(ref, item if kind == "actor" else None)
        self.run_worker(work, exclusive=True, group="stacks")

    async def _stacks(self, ref: str, actor: dict[str, Any] | None) -> None:
        try:
            dump = await asyncio.to_thread(self.client.stacks, ref)
        except AdminError as exc:
            self.set_detail(Text(f"{ref}: {exc}", "bold dark_orange"))
            return
        threads = dump["threads"]
        mine = actor["actor_id"] if actor else None
        threads.sort(key=lambda t: (mine not in t["actors"], not t["actors"], t["name"]))
        text = Text()
        text.append(f"stacks of {dump['proc']} (pid {dump['pid']}, {dump['source']})\n", "bold")
        if dump.get("note"):
            text.append(dump["note"] + "\n", "grey50")
        if actor is not None:
            text.append(f"actor {actor['mesh']} {actor['point']}: {actor['state']}", "bold")
            if actor["current"]:
                text.append(f", in {actor['current']} for {actor['busy_for']:.1f}s", "bold yellow")
            text.append("\n")
        for thread in threads:
            style = "bold yellow" if mine in thread["actors"] else "bold"
            text.append(f"\nThread {thread['name']} ({thread['ident']})", style)
            if thread["actors"]:
                text.append("  actors: " + ", ".join(thread["actors"]), "grey50")
            text.append("\n")
            for frame in thread["frames"]:
                text.append(f"  {frame['filename']}:{frame['lineno']} in ")
                text.append(frame["function"], "bold")
                text.append("\n")
                if frame["line"]:
                    text.append(f"    {frame['line']}\n", "grey70")
        self.set_detail(text)

    def action_widen(self) -> None:
        """Give the side pane (long stack lines) most of the width, or back."""
        self.query_one("#tree", Tree).toggle_class("narrow")
        self.query_one("#side").toggle_class("wide")

    # -- jumps --------------------------------------------------------------------------

    def _go(self, ref: str) -> None:
        node = self.nodes.get(ref)
        if node is not None:
            tree = self.query_one("#tree", Tree)
            tree.move_cursor(node)
            tree.scroll_to_node(node)
        self.show_stacks(ref)

    def action_busiest(self) -> None:
        busy = [item for kind, item in self.items.values() if kind == "actor" and item["current"]]
        if not busy:
            self.set_detail(Text("no actor is running an endpoint now", "grey50"))
            return
        self._go(max(busy, key=lambda actor: actor["busy_for"])["ref"])

    def action_failure(self) -> None:
        failures = [
            ref
            for ref, (kind, item) in self.items.items()
            if (kind == "actor" and item["state"] == "failed")
            or (kind == "proc" and item["state"] in ("died", "not answering"))
        ]
        if not failures:
            self.set_detail(Text("no failures", "green"))
            return
        self._failure_index %= len(failures)
        ref = failures[self._failure_index]
        self._failure_index += 1
        node = self.nodes.get(ref)
        if node is not None:
            tree = self.query_one("#tree", Tree)
            tree.move_cursor(node)
            tree.scroll_to_node(node)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _add(subparsers, "top")


def register_tui(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``monarch tui``: upstream's name for it."""
    _add(subparsers, "tui")


def _add(subparsers: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    parser = subparsers.add_parser(name, help="a live view of a job, from its admin server")
    add_server_options(parser)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        print("monarch top: --interval must be positive", file=sys.stderr)
        return 2
    client = found_server(args, "top")
    if client is None:
        return 2
    TopApp(client, args.interval).run()
    return 0
