"""The package's import arrows and public surfaces (STYLE.md rules 1 and 2).

Imports are read with ``ast``, not by importing, so a forbidden import is caught even inside a
function or an ``if TYPE_CHECKING`` block. Packages that do not exist yet simply have no modules
to check. The rules:

- ``core`` imports no network, serialization or UI library and nothing else of ours;
  ``NEVER_IMPORTS`` lists the other packages' forbidden arrows.
- The subcommands live in ``prefixroute.commands`` (one module each), which only ``cli``
  imports; argparse lives there, in ``cli`` and in ``_help``, never in a package.
- Nothing outside a package imports its private (``_name``) modules, in ``src`` and in
  ``benchmarks/`` alike; benchmarks import a package's names from its ``__init__`` only, each
  one listed in its ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "prefixroute"

# Libraries the routing core must never import (network, serialization, UI, clocks, event loops).
CORE_FORBIDDEN = {
    "aiohttp",
    "zmq",
    "msgspec",
    "rich",
    "matplotlib",
    "prometheus_client",
    "tqdm",
    "asyncio",
    "socket",
    "time",
    "grpc",
    "envoy",
    "kubernetes",
}
# package -> packages of ours it must never import.
# The emulator runs the simulator's replica model, so the gateway must not reach it either;
# commands that wire several packages together live in prefixroute.commands, which no package
# imports (the loop below adds it to every entry).
NEVER_IMPORTS = {
    "prefixroute.core": (),
    "prefixroute.sim": ("prefixroute.gateway", "prefixroute.emulate", "prefixroute.bench"),
    "prefixroute.gateway": ("prefixroute.sim", "prefixroute.emulate", "prefixroute.bench"),
    "prefixroute.emulate": ("prefixroute.gateway", "prefixroute.bench"),
    "prefixroute.events": (
        "prefixroute.sim",
        "prefixroute.gateway",
        "prefixroute.emulate",
        "prefixroute.bench",
    ),
    # The endpoint picker is a front end like the gateway, whose pure pieces it reuses; the
    # gateway does not know it.
    "prefixroute.epp": ("prefixroute.sim", "prefixroute.emulate", "prefixroute.bench"),
}
NEVER_IMPORTS["prefixroute.gateway"] += ("prefixroute.epp",)
NEVER_IMPORTS["prefixroute.bench"] = ("prefixroute.gateway", "prefixroute.emulate")
NEVER_IMPORTS["prefixroute.ray_serve"] = ()
# Decision sharing needs a Router and Redis only: every front end (gateway, picker, Ray router)
# runs it, so it knows none of them.
NEVER_IMPORTS["prefixroute.sync"] = (
    "prefixroute.sim", "prefixroute.gateway", "prefixroute.emulate", "prefixroute.bench",
    "prefixroute.epp", "prefixroute.ray_serve", "prefixroute.events",
)  # fmt: skip
for _package in NEVER_IMPORTS:
    NEVER_IMPORTS[_package] += ("prefixroute.commands",)
# Where argparse may be imported: the entry point, its help formatter and the commands.
ARGPARSE_HOMES = ("prefixroute.cli", "prefixroute._help", "prefixroute.commands")
# Optional dependencies, each imported by one package of ours only, which no other package
# imports: the rest of prefixroute installs, imports and type-checks without them. The
# endpoint picker's gRPC stack and Envoy protos are installed always, but owned the same way.
OPTIONAL = {
    "ray": "prefixroute.ray_serve",
    "kubernetes": "prefixroute.epp",
    "grpc": "prefixroute.epp",
    "grpc_health": "prefixroute.epp",
    "envoy": "prefixroute.epp",
}


@dataclass(frozen=True)
class Module:
    name: str  # dotted module name; a package's __init__ is named after the package
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Import:
    target: str  # the module imported, fully qualified
    names: tuple[tuple[str, str], ...]  # (name, bound as) for ``from X import name as bound``
    line: int


def discover(src: Path = SRC) -> list[Module]:
    modules = []
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules.append(Module(name, path, is_package))
    return modules


MODULES = discover()
KNOWN = {m.name for m in MODULES}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def is_module(name: str, known: set[str]) -> bool:
    """A module or package of ours (namespace packages have no ``__init__`` of their own)."""
    return name in known or any(k.startswith(name + ".") for k in known)


def imports_of(module: Module, source: str, known: set[str] = KNOWN) -> list[Import]:
    """Every import in ``source``, resolved to absolute module names."""
    out = []
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, str(module.path))):
        if isinstance(node, ast.Import):
            out += [Import(alias.name, (), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "__future__":
                continue
            plain = []
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if is_module(sub, known):  # ``from pkg import module``: an import of that module
                    out.append(Import(sub, (), node.lineno))
                else:
                    plain.append((alias.name, alias.asname or alias.name))
            if plain or not node.names:
                out.append(Import(target, tuple(plain), node.lineno))
    return out


def private_owner(target: str) -> str | None:
    """The package that owns ``target`` if a component of it is private (``_name``)."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:i])
    return None


def violations(module: Module, source: str, known: set[str] = KNOWN) -> list[str]:
    found = []
    for imp in imports_of(module, source, known):
        where = f"{module.path.name}:{imp.line} imports {imp.target}"
        top = imp.target.split(".")[0]
        # ``from prefixroute import gateway`` must count even before gateway exists.
        reached = [imp.target] + [f"{imp.target}.{name}" for name, _ in imp.names]
        if within(module.name, "prefixroute.core"):
            if top in CORE_FORBIDDEN:
                found.append(f"{where}: core must not import {top}")
            if top == ROOT and not all(within(t, "prefixroute.core") for t in reached):
                found.append(f"{where}: core imports nothing from prefixroute outside core")
        for package, banned in NEVER_IMPORTS.items():
            if within(module.name, package):
                found += [
                    f"{where}: {package} must never import {b}"
                    for b in banned
                    if any(within(t, b) for t in reached)
                ]
        for library, home in OPTIONAL.items():
            if top == library and not within(module.name, home):
                found.append(f"{where}: only {home} may import {library}")
        for home in sorted(set(OPTIONAL.values())):
            command = home.replace("prefixroute.", "prefixroute.commands.", 1)
            if any(within(t, home) for t in reached) and not (
                within(module.name, home) or module.name == command
            ):
                found.append(f"{where}: nothing outside {home} (and its command) may import it")
        if top == "argparse" and not any(within(module.name, h) for h in ARGPARSE_HOMES):
            found.append(f"{where}: argparse belongs in prefixroute.commands, not a package")
        owner = private_owner(imp.target) if top == ROOT else None
        if owner is not None and not within(module.name, owner):
            found.append(f"{where}: private module of {owner} imported from outside it")
    return found


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.name)
def test_imports_point_the_right_way(module: Module) -> None:
    assert violations(module, module.path.read_text(encoding="utf-8")) == []


def test_the_scan_sees_the_core() -> None:
    assert {
        "prefixroute",
        "prefixroute.core",
        "prefixroute.core.hashing",
        "prefixroute.core.index",
        "prefixroute.core.router",
        "prefixroute.core.policies",
        "prefixroute.core.policies._base",
        "prefixroute.core.speculative",
        "prefixroute.events",
        "prefixroute.events._subscriber",
        "prefixroute.ray_serve",
        "prefixroute.ray_serve._router",
        "prefixroute.epp",
        "prefixroute.epp._stream",
    } <= KNOWN


def test_the_checker_catches_wrong_arrows() -> None:
    known = KNOWN | {"prefixroute.sim.kernel", "prefixroute.gateway._app"}
    core = Module("prefixroute.core.policies.fake", Path("fake.py"), False)
    bad_core = """
import time
from asyncio import sleep
from . import _base
from .. import router
from ...sim import kernel
def later():
    from prefixroute import gateway
    import rich.console
"""
    found = violations(core, bad_core, known)
    assert len(found) == 5, found
    assert not any("_base" in v for v in found)  # a sibling may import its package's _base
    sim = Module("prefixroute.sim.cluster", Path("cluster.py"), False)
    bad_sim = """
from prefixroute.gateway import _app
from prefixroute.core.policies._base import least_loaded_of
from prefixroute.core.policies import _base as base
import time
"""
    found = violations(sim, bad_sim, known)
    assert len(found) == 4, found  # gateway twice (package and private module), _base twice
    gateway = Module("prefixroute.gateway", Path("__init__.py"), True)
    assert violations(gateway, "from ._app import make_app\n", known) == []
    assert len(violations(gateway, "from prefixroute import sim, core\n", known)) == 1
    assert len(violations(gateway, "from prefixroute import not_yet_there\n", known)) == 0
    ray_serve = Module("prefixroute.ray_serve._router", Path("_router.py"), False)
    assert violations(ray_serve, "import ray\nfrom ray.serve import handle\n", known) == []
    assert len(violations(gateway, "from ray import serve\n", known)) == 1
    assert len(violations(core, "import ray.serve\n", known)) == 1
    assert len(violations(sim, "from prefixroute.ray_serve import router_config\n", known)) == 1
    assert len(violations(gateway, "from prefixroute import ray_serve\n", known)) == 1
    sim_pkg = Module("prefixroute.sim", Path("__init__.py"), True)
    assert len(violations(sim_pkg, "from prefixroute import gateway\n", set())) == 1
    assert len(violations(core, "from prefixroute import __version__\n", known)) == 1
    epp = Module("prefixroute.epp._stream", Path("_stream.py"), False)
    assert violations(epp, "import grpc\nfrom prefixroute.gateway import key_of\n", known) == []
    assert len(violations(epp, "from prefixroute.emulate import start_replicas\n", known)) == 1
    assert len(violations(gateway, "from prefixroute.epp import EndpointPicker\n", known)) == 2
    assert len(violations(core, "import grpc\n", known)) == 2  # core's list, and epp's own
    assert len(violations(sim, "import kubernetes.watch\n", known)) == 1


# --- public surface -------------------------------------------------------------------------

PACKAGES = [m for m in MODULES if m.is_package]


def _top_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """Top-level statements, looking inside module-level ``if`` / ``try`` blocks."""
    out: list[ast.stmt] = []
    for node in body:
        out.append(node)
        if isinstance(node, ast.If):
            out += _top_level(node.body) + _top_level(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level(node.body) + _top_level(node.orelse) + _top_level(node.finalbody)
            for handler in node.handlers:
                out += _top_level(handler.body)
    return out


def defined_public_names(package: Module) -> set[str]:
    """Public names the package's ``__init__`` defines itself.

    Names defined by ``def``, ``class`` or assignment; imported names are not counted (a
    package may import helpers for its own use).
    """
    source = package.path.read_text(encoding="utf-8")
    names: set[str] = set()
    for node in _top_level(ast.parse(source).body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def bound_names(package: Module) -> tuple[list[str] | None, set[str]]:
    """The literal ``__all__`` of a package's ``__init__`` and every name it binds, unimported.

    For a package whose optional dependency is not installed here: its ``__init__`` cannot be
    imported, but ``__all__`` can still be checked against what the file binds.
    """
    exported: list[str] | None = None
    bound: set[str] = set()
    for node in _top_level(ast.parse(package.path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.ImportFrom | ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported = list(ast.literal_eval(node.value))
    return exported, bound | defined_public_names(package)


def _optional_missing(package: Module) -> bool:
    return any(
        within(package.name, home) and importlib.util.find_spec(library) is None
        for library, home in OPTIONAL.items()
    )


@pytest.mark.parametrize("package", PACKAGES, ids=lambda m: m.name)
def test_dunder_all_matches_the_public_names(package: Module) -> None:
    if _optional_missing(package):  # imported and checked in full by `make test-ray`
        exported, bound = bound_names(package)
    else:
        mod = importlib.import_module(package.name)
        exported = getattr(mod, "__all__", None)
        bound = {name for name in dir(mod) if hasattr(mod, name)}  # lazy names must resolve
    public = defined_public_names(package)
    if exported is None:
        assert not public, f"{package.name} defines public names but has no __all__"
        return
    assert all(isinstance(name, str) for name in exported)
    assert len(exported) == len(set(exported)), "__all__ lists a name twice"
    missing = [name for name in exported if name not in bound]
    assert missing == [], f"__all__ names that do not exist: {missing}"
    unlisted = sorted(public - set(exported))
    assert unlisted == [], f"public names missing from __all__: {unlisted}"


def test_core_exports_what_its_users_need() -> None:
    core = importlib.import_module("prefixroute.core")
    for name in ("Router", "PrefixIndex", "BlockHasher", "LoadTracker", "make_policy"):
        assert name in core.__all__


def test_defined_public_names_reads_the_init(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text(
        "import os\nfrom typing import Any\nfrom ._impl import Thing\n"
        "X = 1\n_hidden = 2\nA, B = 1, 2\nY: int = 3\n"
        "def make() -> None: ...\nclass Box: ...\n"
        "try:\n    FAST = True\nexcept ImportError:\n    SLOW = True\n"
    )
    names = defined_public_names(Module("pkg", init, True))
    assert names == {"X", "A", "B", "Y", "make", "Box", "FAST", "SLOW"}


# --- benchmarks: public names only ----------------------------------------------------------

BENCHMARKS = sorted((SRC.parent / "benchmarks").glob("*.py"))
PACKAGE_BY_NAME = {m.name: m for m in PACKAGES}


def benchmark_violations(path: Path, source: str) -> list[str]:
    """A benchmark imports ``from prefixroute.<package> import <name in its __all__>`` only:
    never a private module, never a package's module directly."""
    found = []
    module = Module(f"benchmarks.{path.stem}", path, False)
    for imp in imports_of(module, source):
        if imp.target.split(".")[0] != ROOT:
            continue
        where = f"{path.name}:{imp.line} imports {imp.target}"
        if private_owner(imp.target) is not None:
            found.append(f"{where}: a private module")
        elif imp.target not in PACKAGE_BY_NAME:
            found.append(f"{where}: import from its package, not the module")
        else:
            exported, _ = bound_names(PACKAGE_BY_NAME[imp.target])
            unlisted = [name for name, _ in imp.names if name not in (exported or [])]
            if unlisted:
                found.append(f"{where}: {', '.join(unlisted)} not in its __all__")
    return found


@pytest.mark.parametrize("path", BENCHMARKS, ids=lambda p: p.name)
def test_benchmarks_import_public_names_only(path: Path) -> None:
    assert benchmark_violations(path, path.read_text(encoding="utf-8")) == []


def test_the_benchmark_check_catches_private_imports() -> None:
    path = Path("fake_bench.py")
    assert benchmark_violations(path, "from prefixroute.sim import ClusterSim\n") == []
    bad = """
from prefixroute.sync._redis import RouteSync
from prefixroute.sim.cluster import ClusterSim
from prefixroute.sim import ClusterSim, _Live
def later():
    import prefixroute.gateway._requests
"""
    found = benchmark_violations(path, bad)
    assert len(found) == 4, found
    assert "_Live not in its __all__" in found[2]


def test_only_cli_imports_the_commands_and_argparse_stays_there() -> None:
    sim = Module("prefixroute.sim.runner", Path("runner.py"), False)
    assert len(violations(sim, "import argparse\n")) == 1
    assert len(violations(sim, "from prefixroute.commands import simulate\n")) == 1
    cli = Module("prefixroute.cli", Path("cli.py"), False)
    assert violations(cli, "import argparse\nfrom prefixroute.commands import serve\n") == []
    command = Module("prefixroute.commands.epp", Path("epp.py"), False)
    assert violations(command, "from prefixroute.epp import EppConfig\n") == []
    other = Module("prefixroute.commands.serve", Path("serve.py"), False)
    assert len(violations(other, "from prefixroute.epp import EppConfig\n")) == 1
