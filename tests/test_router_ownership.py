"""The Router owns its bookkeeping (issue 12, ``core/router.py``'s docstring): code outside
``core`` never touches a router's index, load view, speculative entries or token counts, not
even to read them. It calls the Router's methods, so every change to the routing state is
found in one file and no second bookkeeping path grows beside the Router's own.

The scan parses every module of ``src/prefixroute`` outside ``core`` and flags an attribute
``index``, ``loads``, ``speculative`` or ``tokens`` taken of anything named ``router`` or
``..._router`` (``self.router.loads``, ``registry.router.index``, ``self._router.index``).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "prefixroute"
OWNED = frozenset({"index", "loads", "speculative", "tokens"})  # the Router's own parts

# Modules another change still has to move to the Router's methods, with the method to use.
# Each entry must name a violation that is still there (see the last test), so the list only
# shrinks.
PENDING: dict[str, str] = {}


def _named_router(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name == "router" or name.endswith("_router")


def reaches_in(source: str) -> list[str]:
    """``line: expression`` for each reach into a router's own parts in ``source``."""
    found = [
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in OWNED and _named_router(node.value)
    ]
    return [f"{line}: {expr}" for line, expr in sorted(found)]


def outside_core() -> dict[str, list[str]]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("core/"):
            continue
        hits = reaches_in(path.read_text(encoding="utf-8"))
        if hits:
            found[rel] = hits
    return found


def test_nothing_outside_core_reaches_into_a_router() -> None:
    found = {rel: hits for rel, hits in outside_core().items() if rel not in PENDING}
    assert found == {}, "use the Router's methods (core/router.py) instead"


def test_the_scan_sees_every_way_in() -> None:
    source = (
        "self.router.index.insert(r, h)\n"
        "loads = registry.router.loads\n"
        "n = len(self._router.speculative)\n"
        "router.tokens.models()\n"
        "gw.router.loads.get(r).in_flight = 1\n"
    )
    assert [hit.split(": ")[0] for hit in reaches_in(source)] == ["1", "2", "3", "4", "5"]


def test_the_scan_lets_the_routers_methods_and_other_objects_through() -> None:
    source = (
        "self.router.replica_load(r).in_flight\n"
        "self.router.remote_routed(r, hashes, now)\n"
        "self.router.hasher.block_size\n"
        "key.tokens\n"
        "self.index.insert(r, h)\n"  # an indexer's own bare index
        "router_of(x).loads\n"  # not a name: out of scope
        "app.router.add_get('/x', handler)\n"  # aiohttp's router
    )
    assert reaches_in(source) == []


def test_pending_modules_still_need_their_change() -> None:
    found = outside_core()
    done = [rel for rel in PENDING if rel not in found]
    assert done == [], f"remove from PENDING, they use the Router's methods now: {done}"
