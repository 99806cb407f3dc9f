"""The packages form a DAG and move as one version train.

Layers (DESIGN.md): transport < core < rdma < tensor; core < telemetry, admin < jobs. A
package may import its own modules and those of the packages below it, never one above it or
beside it. Imports are read with ``ast`` from every ``.py`` under ``packages/*/src`` (relative
imports resolved, ``importlib.import_module("monarch.x")`` literals, upstream's lazy top-level
names such as ``from monarch import Tensor``), plus the entry points and scripts each pyproject
declares.
"""

from __future__ import annotations

import ast
import glob
import re
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ROOT / "packages"
META = "pymonarch"

# The one table of the layering: the subpackages of ``monarch`` each wheel owns (the root
# ``monarch`` module itself belongs to monarch-core), and the wheels each may use directly (the
# allowed edges; whatever those may use is allowed too).
ROOT_OWNER = "monarch-core"
OWNS: dict[str, frozenset[str]] = {
    "monarch-transport": frozenset({"transport"}),
    "monarch-core": frozenset(
        {
            "actor",
            "config",
            "core",
            "tools",
            "_rust_bindings",
            "_src",
            "_testing",
            "_wheels",
            "_zygote_start",
        }
    ),
    "monarch-rdma": frozenset({"rdma"}),
    "monarch-tensor": frozenset(
        {
            "tensor",
            "mesh_controller",
            "timer",
            "builtins",
            # upstream's module paths of tensor-engine names (its docs import them)
            "fetch",
            "tensor_engine",
            "random",
            "memory",
            "profiler",
            "opaque_object",
            "opaque_module",
            "parallel",
            "cached_remote_function",
        }
    ),
    "monarch-jobs": frozenset({"job", "spmd"}),
    "monarch-telemetry": frozenset({"telemetry"}),
    "monarch-admin": frozenset({"admin"}),
}
USES: dict[str, frozenset[str]] = {
    "monarch-transport": frozenset(),
    "monarch-core": frozenset({"monarch-transport"}),
    "monarch-rdma": frozenset({"monarch-core"}),
    "monarch-tensor": frozenset({"monarch-core", "monarch-rdma"}),
    "monarch-jobs": frozenset({"monarch-core", "monarch-telemetry", "monarch-admin"}),
    "monarch-telemetry": frozenset({"monarch-core"}),
    "monarch-admin": frozenset({"monarch-core"}),
}
SUBPACKAGES = frozenset().union(*OWNS.values())


def below(dist: str) -> frozenset[str]:
    """Every wheel ``dist`` may import from, itself excluded."""
    seen: set[str] = set()
    todo = list(USES[dist])
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(USES[d])
    return frozenset(seen)


TOP_LEVEL: dict[str, str] = {"_monarch_guard": "monarch-core"}
"""Modules outside ``monarch`` (where upstream's torchmonarch cannot overwrite them)."""


def owner(module: str) -> str | None:
    """The wheel that ships ``monarch[.sub[...]]``, or None for a module no wheel owns."""
    parts = module.split(".")
    if parts[0] in TOP_LEVEL:
        return TOP_LEVEL[parts[0]]
    if parts[0] != "monarch":
        return None
    if len(parts) == 1:
        return ROOT_OWNER
    return next((dist for dist, subs in OWNS.items() if parts[1] in subs), None)


# ---------------------------------------------------------------------------------------------
# the packages as they are on disk


@cache
def folders() -> dict[str, Path]:
    """Distribution name -> its folder, for every folder under packages/."""
    return {
        tomllib.loads(path.read_text())["project"]["name"]: path.parent
        for path in sorted(PACKAGES.glob("*/pyproject.toml"))
    }


@cache
def pyproject(dist: str) -> dict[str, Any]:
    return tomllib.loads((folders()[dist] / "pyproject.toml").read_text())


def sibling_requirements(dist: str, *, extras: bool) -> list[Requirement]:
    project = pyproject(dist)["project"]
    raw = list(project.get("dependencies", []))
    if extras:
        for reqs in project.get("optional-dependencies", {}).values():
            raw.extend(reqs)
    return [r for r in map(Requirement, raw) if r.name in folders()]


def module_name(path: Path, src: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, src: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import of ``monarch.*`` in one source file."""
    import monarch  # resolves upstream's lazy top-level names to their layer

    lazy: dict[str, tuple[str, str]] = monarch._LAZY
    this = module_name(path, src)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                if module == "monarch" and alias.name in lazy:
                    yield node.lineno, lazy[alias.name][0]  # its layer, not the root
                elif module == "monarch" and alias.name not in SUBPACKAGES:
                    yield node.lineno, module  # an attribute of the root module
                elif alias.name == "*":
                    yield node.lineno, module
                else:
                    yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "monarch" and node.attr in lazy:
                yield node.lineno, lazy[node.attr][0]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if name in {"import_module", "__import__"} and literal:
                yield node.lineno, first.value  # type: ignore[attr-defined]


def entry_point_modules(dist: str) -> Iterator[tuple[str, str]]:
    project = pyproject(dist)["project"]
    groups = dict(project.get("entry-points", {}))
    groups["[project.scripts]"] = project.get("scripts", {})
    groups["[project.gui-scripts]"] = project.get("gui-scripts", {})
    for group, entries in groups.items():
        for name, target in entries.items():
            yield f"entry point {group} {name}", target.partition(":")[0].strip()


CODE_DISTS = sorted(OWNS)


# ---------------------------------------------------------------------------------------------
# the tests


def test_the_table_names_every_package() -> None:
    assert set(folders()) == {*OWNS, META}
    assert set(USES) == set(OWNS)
    for dist in OWNS:
        assert dist not in below(dist), f"{dist} is in a cycle"


@pytest.mark.parametrize("dist", CODE_DISTS)
def test_ships_only_modules_it_owns(dist: str) -> None:
    src = folders()[dist] / "src"
    for path in sorted(src.rglob("*.py")):
        module = module_name(path, src)
        where = path.relative_to(ROOT)
        assert owner(module) == dist, f"{where} is {module}, which {owner(module)} owns"
    root_init = src / "monarch" / "__init__.py"
    assert root_init.exists() == (dist == "monarch-core"), (
        "only monarch-core ships monarch/__init__.py"
    )


@pytest.mark.parametrize("dist", CODE_DISTS)
def test_imports_only_lower_layers(dist: str) -> None:
    src = folders()[dist] / "src"
    allowed = below(dist) | {dist}
    found: list[tuple[str, str]] = [
        (f"{path.relative_to(ROOT)}:{line}", module)
        for path in sorted(src.rglob("*.py"))
        for line, module in imported_modules(path, src)
    ]
    found += list(entry_point_modules(dist))
    bad = []
    for where, module in found:
        if module != "monarch" and not module.startswith("monarch."):
            continue
        owned_by = owner(module)
        if owned_by is None or owned_by not in allowed:
            bad.append(f"{where}: {module} (owned by {owned_by or 'nobody'})")
    assert not bad, f"{dist} may import only {sorted(allowed)}:\n" + "\n".join(bad)


def test_one_version_for_all() -> None:
    versions = {dist: pyproject(dist)["project"].get("version") for dist in folders()}
    assert all(versions.values()), f"every package needs a static version: {versions}"
    assert len(set(versions.values())) == 1, versions


@pytest.mark.parametrize("dist", sorted({*OWNS, META}))
def test_siblings_are_pinned_to_the_train(dist: str) -> None:
    version = pyproject(dist)["project"]["version"]
    for req in sibling_requirements(dist, extras=True):
        assert str(req.specifier) == f"=={version}", f"{dist}: {req} must be pinned =={version}"


@pytest.mark.parametrize("dist", CODE_DISTS)
def test_declared_siblings_respect_the_layers(dist: str) -> None:
    declared = {r.name for r in sibling_requirements(dist, extras=True)}
    assert declared <= below(dist), f"{dist} declares {sorted(declared - below(dist))}"


def test_meta_package_depends_on_every_sibling() -> None:
    required = {r.name for r in sibling_requirements(META, extras=False) if not r.extras}
    assert required == set(OWNS)
    assert not (folders()[META] / "src").exists(), "the meta-package ships no code"


def required_closure(dist: str) -> set[str]:
    todo, seen = [dist], set()
    while todo:
        d = todo.pop()
        if d not in seen:
            seen.add(d)
            todo.extend(r.name for r in sibling_requirements(d, extras=False))
    return seen


@pytest.mark.parametrize("dist", sorted({*OWNS, META}))
def test_per_package_env_has_exactly_the_declared_siblings(dist: str) -> None:
    """``hatch run pkg-<name>:test`` proves a wheel works with its declared dependencies alone."""
    envs = tomllib.loads((ROOT / "hatch.toml").read_text())["envs"]
    env = "pkg-" + folders()[dist].name.removeprefix("monarch-")
    assert env in envs, f"hatch.toml has no {env} environment"
    members = {
        tomllib.loads((Path(p) / "pyproject.toml").read_text())["project"]["name"]
        for pattern in envs[env]["workspace"]["members"]
        for p in glob.glob(str(ROOT / pattern))
    }
    assert members == required_closure(dist)
    assert f"packages/{folders()[dist].name}/tests" in envs[env]["scripts"]["test"]


# ---------------------------------------------------------------------------------------------
# the wings of monarch-core (its subpackages), lowest first: a wing imports only wings of floors
# below its own (the package README says what each holds)

CORE = "monarch.core"
CORE_WINGS: tuple[frozenset[str], ...] = tuple(
    frozenset(CORE if name == "__init__" else f"{CORE}.{name}" for name in floor.split())
    for floor in (
        "_config _command",  # typed keys and layers; the monarch command (imports no runtime)
        "_payload _placement",  # values as bytes and buffers; where the loop thread runs
        "_errors",  # the one exception tree (it pickles what a remote failure carries)
        "_bulk _layout",  # same-host lending through rings; the slicing algebra as values
        "_runtime",  # the per-process runtime: messages, routing, peers, TLS, the running code
        "_mesh",  # the caller side: meshes, endpoints, ports, futures, spawning procs
        "_debugger",  # breakpoints in endpoints, the root client's console
        "_runner",  # the callee side: actor runners and the calling context
        "_host",  # how processes come to be: bootstrap, host agents, zygotes, workers
        "__init__ lowlevel worker __main__ testing",  # the public faces
    )
)


def core_wing(module: str) -> str:
    """The wing (subpackage, or root module) of monarch-core that ``module`` belongs to."""
    return ".".join(module.split(".")[:3])


# the floors of monarch-core's modules: each imports only modules of floors below its own (a
# finer order than the wings', which it keeps; the four old subpackages count as one unit)

CORE_FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(CORE if name == "__init__" else f"{CORE}.{name}" for name in floor.split())
    for floor in (
        # leaves (and the wings' __init__, which import nothing)
        "_config _payload._memory _runtime._netaddr _payload._per_process _command._cli"
        " _command._debug_client _runtime._tls _layout._table _runtime._instrument"
        " _runtime._internal_logs _mesh._workspace _host._reload _payload._filling _mesh._mocks"
        " _mesh._client_end _layout._ids _layout._shape_bytes _host._pids _runtime._open_files"
        " _payload _bulk _layout _mesh _host _command",
        # + the internal log; files by checksum; reloads; a call's tensor copies made while
        # they travel; mocked actors; how an unhandled failure ends the client; upstream's
        # Uid and ProcId; upstream's pickled Extent and Point
        "_payload._tensors _host._adopt _payload._buffers _host._environ _placement",
        # tensors as one buffer each (torch never imported); fd sockets; upstream's write
        # Buffer (small writes copied, large kept); the MONARCH_* names and the job secret a
        # spawner hands its procs; the CPU the runtime's loop keeps to, its waiter's
        "_payload._serialize _bulk._ring _bulk._executor",  # pickling with out-of-band
        # buffers; lenders' rings; the bulk-data executor
        "_errors _mesh._reports",  # the one exception tree; upstream's words for failures
        "_layout._shape _layout._selection _runtime._scope _mesh._supervision _bulk._plane"
        " _mesh._exits _bulk._write_gate",  # mesh algebra; running code; what a bulk-data
        # plane offers; exits; the gate a same-host writer holds
        "_runtime._messages _mesh._endpoint _layout._value_mesh _runtime._actor_logs"
        " _bulk._memory_plane",  # wire; Actor/@endpoint; values; log prefix; same-host reads
        "_runtime._cast _mesh._launch _host._zygote _bulk._lending",  # cast trees and FIFO
        # order; how procs are started; forks; loans of message parts
        "_runtime",  # the per-process runtime (spin, loop, flow, peers, router)
        "_mesh._future _mesh._logs",  # Future/Outcome; procs' output read by their agent
        "_mesh._gather _mesh._port _mesh._ask",  # replies on a port; user ports; ask a proc
        "_mesh._pending _mesh._relay",  # procs still starting, as a value that can be sent;
        # messages to a host's procs through its agent
        "_mesh._mesh_state",  # an actor mesh's procs as its spawner knows them; proc exits
        "_host._watching",  # a host agent watches its procs' heartbeats for their spawner
        "_mesh._actor_mesh",  # the caller side: actor meshes and adverbs
        "_mesh._spawn_hooks",  # upstream's proc mesh spawn callbacks and setup actor
        "_mesh._spawn_actors",  # spawning an actor mesh and supervising it
        "_mesh._proc_group",  # one spawn's procs, their logger mesh and bootstrap
        "_mesh._proc_mesh _mesh._controller",  # proc and host meshes; get_or_spawn_controller
        "_runner._context _debugger _host._code_sync",  # context(); breakpoints; sync_workspace
        "_runner",  # the callee side: actor runners, sync and async apart
        "_host._spawning _host._rehearsal",  # how a host agent starts, watches and kills its
        # procs; a proc's start run by its zygote before it forks
        "_host._introspect",  # what a proc says of itself when asked (actors, process,
        # stacks, the procs it started)
        "_host._bootstrap _host._tls_cli",  # starts runtimes (controller, proc, worker); owns
        # MONARCH_* names; monarch tls
        "_host._zygote_proc",  # the zygote's loop (a program, or forked by monarch worker)
        "__init__ lowlevel _host._proc _host._worker",  # the faces (siblings' API, the
        # mechanisms'); entry points
        "_host._attach _host._gateway worker __main__ testing",  # attach_to_workers, attach,
        # enable_transport; monarch gateway; python -m monarch.core.worker, python -m monarch.core
    )
)
CORE_UNITS = frozenset().union(*CORE_FLOORS)


def core_unit(module: str) -> str:
    """The core module or subpackage that ``module`` belongs to (its floor's unit)."""
    four = ".".join(module.split(".")[:4])
    return four if four in CORE_UNITS else ".".join(module.split(".")[:3])


def type_checking_lines(path: Path) -> set[int]:
    """Lines of the imports under ``if TYPE_CHECKING:``: names for annotations only (a class
    and the module that builds it, annotated by a lower one), never run."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def core_imports() -> Iterator[tuple[Path, int, str, str]]:
    """(file, line, importing unit, imported unit) for imports between core units that run."""
    src = folders()[ROOT_OWNER] / "src"
    for path in sorted((src / "monarch" / "core").rglob("*.py")):
        this = core_unit(module_name(path, src))
        typing_only = type_checking_lines(path)
        for line, module in imported_modules(path, src):
            if line in typing_only:
                continue
            if module == CORE or module.startswith(CORE + "."):
                target = core_unit(module)
                if target != this:
                    yield path, line, this, target


def test_core_floors_name_every_core_module() -> None:
    src = folders()[ROOT_OWNER] / "src"
    units = {core_unit(module_name(p, src)) for p in (src / "monarch" / "core").rglob("*.py")}
    placed = frozenset().union(*CORE_FLOORS)
    assert units == placed, f"unplaced: {sorted(units - placed)}; gone: {sorted(placed - units)}"


def test_core_modules_import_only_lower_floors() -> None:
    floor_of = {unit: n for n, floor in enumerate(CORE_FLOORS) for unit in floor}
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {this} (floor {floor_of[this]}) imports {target} "
        f"(floor {floor_of.get(target)})"
        for path, line, this, target in core_imports()
        if floor_of.get(target, len(CORE_FLOORS)) >= floor_of[this]
    ]
    assert not wrong, "\n".join(wrong)


def test_core_wings_import_only_lower_wings() -> None:
    src = folders()[ROOT_OWNER] / "src"
    wings = {core_wing(module_name(p, src)) for p in (src / "monarch" / "core").rglob("*.py")}
    placed = frozenset().union(*CORE_WINGS)
    assert wings == placed, f"unplaced: {sorted(wings - placed)}; gone: {sorted(placed - wings)}"
    floor_of = {wing: n for n, floor in enumerate(CORE_WINGS) for wing in floor}
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {core_wing(this)} imports {core_wing(target)}"
        for path, line, this, target in core_imports()
        if core_wing(this) != core_wing(target)
        and floor_of.get(core_wing(target), len(CORE_WINGS)) >= floor_of[core_wing(this)]
    ]
    assert not wrong, "\n".join(wrong)


def test_core_imports_nothing_of_monarch_inside_a_function() -> None:
    """An import inside a function is how a circle hides: none in the core's sources."""
    src = folders()[ROOT_OWNER] / "src"
    found = []
    for path in sorted((src / "monarch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if (
                        isinstance(inner, ast.ImportFrom)
                        and (inner.level or (inner.module or "").startswith("monarch"))
                    ) or (
                        isinstance(inner, ast.Import)
                        and any(a.name.startswith("monarch") for a in inner.names)
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert not found, f"imports inside functions: {found}"


def test_the_layers_above_use_only_the_public_core() -> None:
    """The sibling wheels, the benchmarks, the examples and the tools reach monarch-core
    through its public modules only (``monarch.core``, ``monarch.core.worker``,
    ``monarch.actor``...): no import of a private ``monarch.core._*`` module, and no string
    naming one (``python -m monarch.core._x``, a lazy import): what the core keeps private
    it may change.
    monarch-core's own tests are the exception (they test its internals); a bytes literal
    matched against a process's command line (which program a pid runs) is observation,
    not use, and is not counted."""
    private = re.compile(r"monarch\.core\._\w+")
    files = [
        path
        for dist, folder in folders().items()
        if dist not in {ROOT_OWNER, "monarch-transport"}
        for path in sorted(folder.rglob("*.py"))
    ]
    files += sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "examples").rglob("*.py"))
    files += [ROOT / "conftest.py", *sorted((ROOT / "integration").glob("*.py"))]
    files += sorted((ROOT / "tools").rglob("*.py"))
    found = [
        f"{path.relative_to(ROOT)}:{line}: {hit.group()}"
        for path in files
        if path != Path(__file__)
        for line, name in named_modules(path, entry_points=True)
        for hit in private.finditer(name)
    ]
    assert not found, "\n".join(found)


def named_modules(path: Path, entry_points: bool) -> Iterator[tuple[int, str]]:
    """Each module ``path`` imports (absolute imports), and each string in it (a module it
    may run or import by name: ``python -m x``, ``import_module("x")``), with its line;
    ``entry_points=False`` leaves out strings in an entry point's ``module:attr`` form."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            yield node.lineno, node.module or ""
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and (entry_points or ":" not in node.value)
        ):
            yield node.lineno, node.value


UPSTREAM_PRIVATE_PATHS = frozenset({"_src", "_rust_bindings"})
"""Modules of upstream's whose names are private but whose paths its users import."""


def private_module_pattern(owned: frozenset[str]) -> re.Pattern[str]:
    """What a wheel keeps private: ``monarch.<its subpackage>._*``, and its own private
    subpackages of ``monarch`` (``monarch._wheels``), upstream's paths aside."""
    subs = "|".join(map(re.escape, sorted(owned)))
    own = "|".join(
        re.escape(sub)
        for sub in sorted(owned)
        if sub.startswith("_") and sub not in UPSTREAM_PRIVATE_PATHS
    )
    return re.compile(rf"\bmonarch\.(?:(?:{subs})\._\w+" + (rf"|(?:{own})\b)" if own else ")"))


def test_no_wheel_imports_another_wheels_private_modules() -> None:
    """What each wheel keeps private (``monarch.<its subpackage>._*``, and monarch-core's
    ``monarch._wheels``, ``monarch._testing``...) only that wheel and its own tests import:
    another wheel, a benchmark, an example or an integration script goes through the public
    modules (``monarch.transport.lowlevel`` for a data plane built on the transports,
    ``monarch.core.worker``...), so a wheel may change its private modules alone. A string
    naming a private module in the ``module:attribute`` form of an entry point is a
    plug-in's registration (a wheel names its own), read, not imported, and is not counted."""
    private = {dist: private_module_pattern(owned) for dist, owned in OWNS.items()}
    outside = [
        *sorted((ROOT / "benchmarks").glob("*.py")),
        *sorted((ROOT / "examples").rglob("*.py")),
        ROOT / "conftest.py",
        *sorted((ROOT / "integration").glob("*.py")),
        *sorted((ROOT / "tools").rglob("*.py")),
    ]
    found = []
    for dist, pattern in private.items():
        others = [
            path
            for other, folder in folders().items()
            if other != dist
            for path in sorted(folder.rglob("*.py"))
        ]
        found += [
            f"{path.relative_to(ROOT)}:{line}: {hit.group()} (of {dist})"
            for path in [*others, *outside]
            if path != Path(__file__)
            for line, name in named_modules(path, entry_points=False)
            for hit in pattern.finditer(name)
        ]
    assert not found, "\n".join(found)


# ---------------------------------------------------------------------------------------------
# no import circle inside a wheel: each module's imports (those at module level, the ones under
# ``if TYPE_CHECKING:`` included) form a DAG, so a reader can walk any wheel from the ground up


def module_level_import_lines(path: Path) -> set[int]:
    """Lines of the ``import`` statements that run when the module is imported (or that
    only a type checker reads): those inside a function body are left out."""
    inside: set[int] = set()
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import | ast.ImportFrom):
                    inside.add(inner.lineno)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            lines.add(node.lineno)
    return lines - inside


def import_graph(src: Path) -> dict[str, set[str]]:
    """Module -> the modules under the same ``src`` (one wheel's) it imports at module level."""
    paths = {module_name(path, src): path for path in sorted(src.rglob("*.py"))}
    graph: dict[str, set[str]] = {module: set() for module in paths}
    for module, path in paths.items():
        top = module_level_import_lines(path)
        for line, imported in imported_modules(path, src):
            if line not in top:
                continue
            # ``from pkg import name``: the submodule ``pkg.name`` if there is one, else ``pkg``
            target = imported
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != module:
                graph[module].add(target)
    return graph


def import_circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: set[frozenset[str]] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                circles.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def circle_path(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    """One loop through ``circle``, as ``a -> b -> ... -> a``, to say where to cut it."""
    start = min(circle)
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        node = todo.pop(0)
        for nxt in sorted(graph[node] & circle):
            if nxt == start:
                route = [node]
                while route[-1] != start:
                    route.append(came_from[route[-1]])
                return " -> ".join([*reversed(route), start])
            if nxt not in came_from:
                came_from[nxt] = node
                todo.append(nxt)
    return ", ".join(sorted(circle))


@pytest.mark.parametrize("dist", CODE_DISTS)
def test_no_import_circle_inside_a_wheel(dist: str) -> None:
    graph = import_graph(folders()[dist] / "src")
    found = import_circles(graph)
    new = [circle_path(graph, circle) for circle in sorted(found, key=sorted)]
    assert not new, f"{dist} has import circles (TYPE_CHECKING imports count):\n" + "\n".join(new)


def test_an_import_circle_is_found(tmp_path: Path) -> None:
    """The finder itself: a loop through a TYPE_CHECKING import is a circle, one through an
    import inside a function is not (it runs once both modules are loaded)."""
    package = tmp_path / "monarch" / "fake"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "_a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\n"
    )
    (package / "_b.py").write_text("from . import _c\nclass B: ...\n")
    (package / "_c.py").write_text("from monarch.fake._a import x\n")
    (package / "_d.py").write_text("def f() -> None:\n    from . import _e\n")
    (package / "_e.py").write_text("from ._d import f\n")
    graph = import_graph(tmp_path)
    assert graph["monarch.fake._d"] == set() and graph["monarch.fake._e"] == {"monarch.fake._d"}
    (circle,) = import_circles(graph)
    assert circle == {"monarch.fake._a", "monarch.fake._b", "monarch.fake._c"}
    assert circle_path(graph, circle) == (
        "monarch.fake._a -> monarch.fake._b -> monarch.fake._c -> monarch.fake._a"
    )


# ---------------------------------------------------------------------------------------------
# one plug-in loader: every entry-point group of the repository is read by
# ``monarch.transport._plugins`` (lazily, with ``pip install`` hints and duplicate detection)

PLUGIN_LOADER = "monarch-transport", Path("monarch/transport/_plugins.py")
FOREIGN_GROUPS = frozenset({"pytest11"})
"""Groups that another program reads (pytest's plug-ins)."""


def declared_groups() -> dict[str, list[str]]:
    """Each entry-point group the wheels declare, with the wheels that declare it."""
    groups: dict[str, list[str]] = {}
    for dist in CODE_DISTS:
        for group in pyproject(dist)["project"].get("entry-points", {}):
            if group not in FOREIGN_GROUPS:
                groups.setdefault(group, []).append(dist)
    return groups


def test_every_entry_point_group_is_read_by_the_one_loader() -> None:
    """No module but the loader reads entry points itself (``importlib.metadata``'s
    ``entry_points``, an ``EntryPoint``'s ``load`` aside, which the loader hands out), and
    every group a wheel declares is named by the code that asks the loader for it and in
    the loader's docstring, the list a plug-in's author reads."""
    dist, relative = PLUGIN_LOADER
    loader = folders()[dist] / "src" / relative
    readers = []
    named: set[str] = set()
    for folder in folders().values():
        for path in sorted(folder.glob("src/**/*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    named.add(node.value)
                uses = (
                    (isinstance(node, ast.Name) and node.id == "entry_points")
                    or (isinstance(node, ast.Attribute) and node.attr == "entry_points")
                    or (
                        isinstance(node, ast.ImportFrom)
                        and any(alias.name == "entry_points" for alias in node.names)
                    )
                )
                if uses and path != loader:
                    readers.append(f"{path.relative_to(ROOT)}: {ast.unparse(node)[:60]}")
    assert not readers, "read entry points through monarch.transport's plugin_group:\n" + (
        "\n".join(readers)
    )
    groups = declared_groups()
    assert groups, "no entry-point group found"
    unread = sorted(set(groups) - named)
    assert not unread, f"groups no code names (so none reads them): {unread}"
    doc = ast.get_docstring(ast.parse(loader.read_text())) or ""
    undocumented = sorted(group for group in groups if f"``{group}``" not in doc)
    assert not undocumented, f"{loader.relative_to(ROOT)}'s docstring omits {undocumented}"


def test_the_private_pattern_tells_private_from_public() -> None:
    core = private_module_pattern(OWNS[ROOT_OWNER])
    for name in ("monarch.core._mesh", "monarch._wheels", "monarch._testing", "monarch.actor._x"):
        assert core.search(name), name
    for name in ("monarch.core", "monarch.core.lowlevel", "monarch._src.job", "monarch.actor"):
        assert not core.search(name), name
    assert private_module_pattern(OWNS["monarch-rdma"]).search("monarch.rdma._tcp")
