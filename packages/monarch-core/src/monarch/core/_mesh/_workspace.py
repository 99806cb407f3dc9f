"""The user's workspace as files with checksums, and writing them on a host so that no
half-written file is ever visible.

``sync_workspace`` (``_code_sync``) compares the client's manifest of a directory (each
file's size and SHA-256) with each host's, and sends only what differs: one changed file
of a large workspace costs that file. Hashes are kept by (size, mtime, inode), so a
second scan reads only files that changed since the first. A host writes each file under
a temporary name in its directory and renames it into place: a sync cut short (a dead
host, a dead client) leaves old files or new ones, never a part of one, and the next sync
removes the temporaries.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

TEMPORARY: Final = ".monarch-sync-"
"""Prefix of a file being written (renamed into place once whole)."""
SKIPPED_DIRS: Final = frozenset({"__pycache__"})
"""Directories never synced: each host's Python writes its own."""
WORKSPACE_ENV: Final = "WORKSPACE_DIR"
"""Where a host keeps synced workspaces (upstream's name); by default ``DEFAULT_ROOT``."""
DEFAULT_ROOT: Final = "~/.monarch/workspace"

Digest = tuple[int, str]
"""A file's size and SHA-256 (hex)."""
Manifest = dict[str, Digest]
"""Relative path (``/``-separated) -> digest, for every file of a directory."""


class Workspace:
    """Local directories to push to every host (upstream's ``monarch.tools.config.Workspace``).

    ``dirs``: a list (each directory lands as ``$WORKSPACE_DIR/<its name>`` on the hosts)
    or a mapping of local directory to its path under ``$WORKSPACE_DIR`` (``""``: the
    root itself). ``env`` is upstream's environment to sync with ``conda=True`` (kept,
    unused here).
    """

    def __init__(
        self,
        dirs: Sequence[Path | str] | Mapping[Path | str, str] | None = None,
        env: object = None,
    ) -> None:
        self.env = env
        self.dirs: dict[Path, str] = {}
        """Local directory -> its path under the host's workspace root."""
        if dirs is None:
            return
        if isinstance(dirs, Mapping):
            pairs = [(Path(src), str(dst)) for src, dst in dirs.items() if _non_empty(src)]
        else:
            pairs = [(Path(d), Path(d).name) for d in dirs if _non_empty(d)]
        for src, dst in pairs:
            self.dirs[src] = check_relative(dst) if dst else ""

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Workspace):
            return NotImplemented
        return self.env == other.env and self.dirs == other.dirs

    def __hash__(self) -> int:
        return hash(tuple(self.dirs.items()))

    def __repr__(self) -> str:
        dirs = {str(k): v for k, v in self.dirs.items()}
        return f"Workspace(dirs={dirs!r})"

    @staticmethod
    def null() -> Workspace:
        """No directories, no environment (upstream's)."""
        return Workspace(env=None)


def _non_empty(path: Path | str) -> bool:
    if not str(path):
        raise ValueError(f"{path!r} must not be empty: it would mean the current directory")
    return True


def check_relative(path: str) -> str:
    """``path`` if it names a place inside a directory (no ``..``, not absolute)."""
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or not parts:
        raise ValueError(f"{path!r} must be a relative path inside the workspace")
    return "/".join(parts)


SYNCED_ENV: Final = "MONARCH_WORKSPACE_DIRS"
"""The directories (under a host's workspace root) synced before a proc was spawned: on
its ``sys.path`` from its start."""
synced: set[str] = set()
"""What ``sync_workspace`` pushed from this process (the procs it spawns later get them)."""


def put_synced_on_path() -> None:
    """A proc's start: the synced directories its spawner names, first on ``sys.path``."""
    root = workspace_root()
    for dst in reversed([d for d in os.environ.get(SYNCED_ENV, "").split(os.pathsep) if d]):
        path = os.path.normpath(root / dst)
        if path not in sys.path:
            sys.path.insert(0, path)


def workspace_root() -> Path:
    """Where this host keeps workspaces: ``$WORKSPACE_DIR`` or ``~/.monarch/workspace``."""
    return Path(os.environ.get(WORKSPACE_ENV) or DEFAULT_ROOT).expanduser()


@dataclass(slots=True)
class _Known:
    size: int
    mtime_ns: int
    inode: int
    digest: str


class Hashes:
    """SHA-256 of files, kept by path while their size, mtime and inode stay the same."""

    def __init__(self) -> None:
        self._known: dict[str, _Known] = {}

    def digest(self, path: str, info: os.stat_result) -> Digest:
        known = self._known.get(path)
        if (
            known is None
            or known.size != info.st_size
            or known.mtime_ns != info.st_mtime_ns
            or known.inode != info.st_ino
        ):
            known = _Known(info.st_size, info.st_mtime_ns, info.st_ino, file_sha256(path))
            self._known[path] = known
        return known.size, known.digest

    def remember(self, path: str, data: bytes | memoryview) -> None:
        """``path`` was just written with ``data``: its digest, without reading it back."""
        info = os.stat(path)
        digest = hashlib.sha256(data).hexdigest()
        self._known[path] = _Known(info.st_size, info.st_mtime_ns, info.st_ino, digest)

    def manifest(self, root: Path) -> Manifest:
        """Every regular file under ``root`` (symlinks followed), by relative path."""
        found: Manifest = {}
        for relative, path, info in walk(root):
            found[relative] = self.digest(path, info)
        return found


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def walk(root: Path) -> Iterator[tuple[str, str, os.stat_result]]:
    """``(relative path, path, stat)`` of every file under ``root``, in sorted order;
    ``__pycache__`` and files being written left out. Nothing when ``root`` is absent."""
    if not root.is_dir():
        return
    stack = [(str(root), "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name, reverse=True)
        except FileNotFoundError:
            continue
        for entry in entries:
            if entry.name.startswith(TEMPORARY):
                continue
            relative = f"{prefix}{entry.name}"
            try:
                info = entry.stat()  # follows symlinks: a link to a file syncs the file
            except FileNotFoundError:
                continue  # a dangling link, or a file removed meanwhile
            if stat.S_ISDIR(info.st_mode):
                if entry.name not in SKIPPED_DIRS:
                    stack.append((entry.path, f"{relative}/"))
            elif stat.S_ISREG(info.st_mode):
                yield relative, entry.path, info


def changes(local: Manifest, remote: Manifest) -> tuple[list[str], list[str]]:
    """What a host must write (new or different) and remove (gone here) to match ``local``."""
    send = sorted(rel for rel, digest in local.items() if remote.get(rel) != digest)
    remove = sorted(rel for rel in remote if rel not in local)
    return send, remove


def batches(sizes: Iterable[tuple[str, int]], most: int) -> list[list[str]]:
    """Paths in groups of at most ``most`` bytes each (a larger file alone)."""
    groups: list[list[str]] = []
    current: list[str] = []
    held = 0
    for path, size in sizes:
        if current and held + size > most:
            groups.append(current)
            current, held = [], 0
        current.append(path)
        held += size
    if current:
        groups.append(current)
    return groups


def inside(root: Path, relative: str) -> Path:
    """``root / relative``, refusing a path that would leave ``root``."""
    return root / check_relative(relative)


def write_whole(root: Path, relative: str, data: bytes | memoryview, mode: int) -> str:
    """Write ``root/relative``: to a temporary name beside it, then renamed into place;
    its path."""
    target = inside(root, relative)
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f"{TEMPORARY}{target.name}.{secrets.token_hex(4)}"
    try:
        with open(temporary, "wb") as file:
            file.write(data)
        os.chmod(temporary, stat.S_IMODE(mode) or 0o644)
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return str(target)


def remove(root: Path, relatives: Iterable[str]) -> None:
    """Remove files (and the directories they leave empty, up to ``root``)."""
    for relative in relatives:
        target = inside(root, relative)
        target.unlink(missing_ok=True)
        parent = target.parent
        while parent != root and parent.is_relative_to(root):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


def remove_temporaries(root: Path) -> int:
    """Remove what a sync cut short left being written under ``root``; how many."""
    removed = 0
    if not root.is_dir():
        return 0
    for directory, _, files in os.walk(root):
        for name in files:
            if name.startswith(TEMPORARY):
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed
