"""The import structure of zg: no import cycles, zgdata never imports zgtrain, no private name crosses a
module, and Ray stays in the three modules at the edge (zgdata/core/ray_cluster.py and its two users).

Every module of zgdata and zgtrain is parsed with ``ast`` and every import counts, wherever it is: at the top,
inside a function (a lazy import hides a cycle from Python, not from a reader), under ``if TYPE_CHECKING``.
``from pkg import mod`` is an edge to the submodule ``pkg.mod`` when that is a module, else to ``pkg``.
The walker itself is checked first on a small package written to ``tmp_path``.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from zgtrain import docs_ref

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("zgdata", "zgtrain")


@dataclass(frozen=True)
class Edge:
    src: str  # importing module
    dst: str  # imported module
    where: str  # path:line of the import statement
    names: tuple[str, ...] = ()  # the names a `from X import ...` takes from dst


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages under root."""
    out = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def _known(name: str, mods: dict[str, Path]) -> str | None:
    """NAME if it is one of the modules, else its longest dotted prefix that is (None: not ours)."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


@functools.cache
def nodes(f: Path) -> tuple[ast.AST, ...]:
    """Every node of the file's syntax tree (parsed once per run: the repo's checks below walk each module
    several times)."""
    return tuple(ast.walk(ast.parse(f.read_text(), filename=str(f))))


@functools.cache
def edges(root: Path, packages: tuple[str, ...]) -> tuple[Edge, ...]:
    """Every import between modules of the packages, at any depth of each module's syntax tree."""
    mods = modules(root, packages)
    out = []
    for mod, f in mods.items():
        pkg = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in nodes(f):
            where = f"{f.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                for a in node.names:
                    if (dst := _known(a.name, mods)) and dst != mod:
                        out.append(Edge(mod, dst, where))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up from this module's package
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    if sub in mods:  # `from pkg import mod`: the submodule itself
                        if sub != mod:
                            out.append(Edge(mod, sub, where))
                    elif (dst := _known(base, mods)) and dst != mod:
                        out.append(Edge(mod, dst, where, (a.name,)))
    return tuple(out)


def importers(root: Path, packages: tuple[str, ...], name: str) -> set[str]:
    """The modules of the packages that import NAME (or a submodule of it), at any depth."""
    out = set()
    for mod, f in modules(root, packages).items():
        for node in nodes(f):
            got = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if any(g == name or g.startswith(f"{name}.") for g in got):
                out.add(mod)
    return out


def cycles(es: tuple[Edge, ...]) -> list[list[Edge]]:
    """One cycle (as its edges) through each strongly connected group of modules (Tarjan's algorithm)."""
    graph: dict[str, dict[str, Edge]] = {}
    for e in es:
        graph.setdefault(e.src, {}).setdefault(e.dst, e)
    index, low, stack, on, groups = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    found = []
    for group in groups:  # a shortest way from the group's first module back to itself, inside the group
        start = min(group)
        prev: dict[str, Edge] = {}
        todo = [start]
        while todo and start not in prev:
            v = todo.pop(0)
            for w, e in sorted(graph.get(v, {}).items()):
                if w in group and w not in prev:
                    prev[w] = e
                    todo.append(w)
        path, v = [], start
        while True:
            path.append(prev[v])
            v = prev[v].src
            if v == start:
                break
        found.append(path[::-1])
    return found


def _describe(cycle: list[Edge]) -> str:
    return " -> ".join([cycle[0].src, *(f"{e.dst} ({e.where})" for e in cycle)])


def _private(es: tuple[Edge, ...]) -> list[str]:
    return [
        f"{e.where}: {e.src} imports {n} from {e.dst}"
        for e in es
        for n in e.names
        if n.startswith("_") and not (n.startswith("__") and n.endswith("__"))
    ]


def test_the_walker_sees_lazy_imports_submodules_and_private_names(tmp_path):
    pkg = tmp_path / "pk"
    (pkg / "sub").mkdir(parents=True)
    for f in ("__init__.py", "sub/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "a.py").write_text("from pk.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    if True:\n        from pk.c import _hidden\n")
    (pkg / "c.py").write_text("import os\n\n\ndef g():\n    from .sub.b import f\n    import pk.a\n")
    (pkg / "d.py").write_text("from . import c\nfrom pk import d\n")
    es = edges(tmp_path, ("pk",))
    assert {(e.src, e.dst) for e in es} == {
        ("pk.a", "pk.sub.b"),
        ("pk.sub.b", "pk.c"),
        ("pk.c", "pk.sub.b"),
        ("pk.c", "pk.a"),
        ("pk.d", "pk.c"),
    }
    found = cycles(es)
    assert [[(e.src, e.dst) for e in c] for c in found] == [
        [("pk.a", "pk.sub.b"), ("pk.sub.b", "pk.c"), ("pk.c", "pk.a")]
    ]
    assert _describe(found[0]).startswith("pk.a -> pk.sub.b (pk/a.py:1) -> pk.c (pk/sub/b.py:3)")
    assert _private(es) == ["pk/sub/b.py:3: pk.sub.b imports _hidden from pk.c"]


def test_no_import_cycles():
    found = cycles(edges(REPO, PACKAGES))
    if found:
        pytest.fail(
            "import cycles (move what both sides need into a module of its own):\n"
            + "\n".join(_describe(c) for c in found)
        )


def test_zgdata_never_imports_zgtrain():
    bad = [
        f"{e.where}: {e.src} imports {e.dst}"
        for e in edges(REPO, PACKAGES)
        if e.src.split(".")[0] == "zgdata" and e.dst.split(".")[0] == "zgtrain"
    ]
    if bad:
        pytest.fail("zgdata knows nothing about students:\n" + "\n".join(bad))


def test_ray_stays_in_its_three_modules_at_the_edge():
    assert importers(REPO, PACKAGES, "ray") == {
        "zgdata.core.ray_cluster",
        "zgdata.materialize.ray_shards",
        "zgtrain.exec.ray_tasks",
    }


def test_no_private_name_crosses_a_module():
    bad = _private(edges(REPO, PACKAGES))
    if bad:
        pytest.fail(
            "a private name imported across modules (give it a public name in the module it belongs to):\n"
            + "\n".join(bad)
        )


# The room order: declared once, in docs/ARCHITECTURE.md's "Room order" block, one line per package, rooms
# from the bottom up. A room is a package's sub-package or flat module (``zgdata.store.reader`` is in ``store``).
ORDER_DOC = REPO / "docs" / "ARCHITECTURE.md"


def declared_order(text: str) -> dict[str, list[str]]:
    """``{package: [room, ...]}`` (bottom first) from the ```text block under the '## Room order' heading."""
    _, found, rest = text.partition("## Room order")
    assert found, f"{ORDER_DOC.name} has no '## Room order' section"
    block = rest.split("```text", 1)[1].split("```", 1)[0]
    out = {}
    for line in block.strip().splitlines():
        pkg, _, rooms = line.partition(":")
        out[pkg.strip()] = [r.strip() for r in rooms.split("<")]
    return out


def room(mod: str) -> str:
    """The room of a dotted module name: its package's first component below the top package."""
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rooms_of(root: Path, pkg: str) -> set[str]:
    return {room(m) for m in modules(root, (pkg,))} - {"__init__"}


def upward(es: tuple[Edge, ...], order: dict[str, list[str]]) -> list[str]:
    """Every import from a room to a room at or above it (by the declared order) inside one package."""
    bad = []
    for e in es:
        pkg = e.src.split(".")[0]
        if pkg != e.dst.split(".")[0] or pkg not in order:
            continue
        a, b = room(e.src), room(e.dst)
        if a == b or "__init__" in (a, b):
            continue
        rank = {r: i for i, r in enumerate(order[pkg])}
        if rank[b] >= rank[a]:
            bad.append(f"{e.where}: {e.src} (room {a}) imports {e.dst} (room {b}, above it)")
    return bad


def test_the_room_check_finds_an_import_upward(tmp_path):
    pkg = tmp_path / "pk"
    for d in ("low", "high"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "high" / "a.py").write_text("from pk.low import b\n")
    (pkg / "low" / "b.py").write_text("def f():\n    from pk.top import c\n")
    (pkg / "top.py").write_text("import pk.high.a\n")
    es = edges(tmp_path, ("pk",))
    order = declared_order("## Room order\n\n```text\npk: low < high < top\n```\n")
    assert order == {"pk": ["low", "high", "top"]}
    assert rooms_of(tmp_path, "pk") == {"low", "high", "top"}
    assert upward(es, order) == ["pk/low/b.py:2: pk.low.b (room low) imports pk.top (room top, above it)"]


def test_each_room_imports_only_the_rooms_below_it():
    order = declared_order(ORDER_DOC.read_text())
    assert set(order) == set(PACKAGES), f"{ORDER_DOC.name}'s room order names {sorted(order)}"
    for pkg in PACKAGES:
        have, listed = rooms_of(REPO, pkg), order[pkg]
        assert len(listed) == len(set(listed)), f"a room is listed twice in {pkg}'s order"
        assert have == set(listed), (
            f"{pkg}'s rooms and {ORDER_DOC.name}'s room order differ: not listed {sorted(have - set(listed))}, "
            f"listed but absent {sorted(set(listed) - have)}"
        )
    bad = upward(edges(REPO, PACKAGES), order)
    if bad:
        pytest.fail("a room imports a room above it (move the shared piece down, or pass it in):\n" + "\n".join(bad))


# The stages' entry modules: the function each stage's `zg` command calls lives there.
STAGE_ENTRY = {
    "teacher": ["zgdata.teacher.prepare"],
    "sample": ["zgdata.tokens.sample"],
    "tokens": ["zgdata.tokens.tokenset"],
    "materialize": ["zgdata.materialize.driver"],
    "verify": ["zgdata.verify"],
    "virtual": ["zgdata.materialize.virtual"],
    "train": ["zgtrain.block.train"],
    "assemble": ["zgtrain.student.assemble"],
    "evaluate": ["zgtrain.evaluate.run"],
    "local": ["zgtrain.local.simultaneous", "zgtrain.local.sequential"],
    "lm_eval": ["zgtrain.evaluate.lm_eval"],
    "repair_eval": ["zgtrain.evaluate.run"],
    "repair": ["zgtrain.repair.train"],
    "variant": ["zgtrain.search.variants"],
    "search": ["zgtrain.search.solve"],
    "search_cost": ["zgtrain.search.table"],
    "search_assemble": ["zgtrain.search.assemble"],
    "search_repair": ["zgtrain.search.repair"],
    "export_hf": ["zgtrain.export.run", "zgtrain.export.hf"],
    "export_gguf": ["zgtrain.export.run", "zgtrain.export.gguf"],
}


def reachable(es: tuple[Edge, ...], start: list[str]) -> set[str]:
    """The modules START imports, at any depth (function-level imports included), START among them."""
    graph: dict[str, set[str]] = {}
    for e in es:
        graph.setdefault(e.src, set()).add(e.dst)
    seen, todo = set(), list(start)
    while todo:
        v = todo.pop()
        if v not in seen:
            seen.add(v)
            todo += graph.get(v, ())
    return seen


def test_the_code_table_names_only_code_each_stage_can_run():
    """zgtrain/pipeline/code.py lists, per stage, the files whose edit reruns it (a checkout of zg itself). Each
    listed module must exist and be reachable in the import graph from the stage's entry module: a module that
    moved, or that the stage no longer runs, is named here instead of silently watching nothing."""
    from zgtrain.pipeline.code import CODE

    assert set(CODE) == set(STAGE_ENTRY), f"stages without an entry here: {sorted(set(CODE) ^ set(STAGE_ENTRY))}"
    es = edges(REPO, PACKAGES)
    by_file = {str(f.relative_to(REPO)): m for m, f in modules(REPO, PACKAGES).items()}
    bad = []
    for stage, paths in CODE.items():
        runs = reachable(es, STAGE_ENTRY[stage])
        for p in paths:
            if not (REPO / p).exists():
                bad.append(f"{stage}: {p} does not exist")
            elif p.endswith(".py") and by_file.get(p) not in runs:
                bad.append(f"{stage}: {p} is not imported by {', '.join(STAGE_ENTRY[stage])} at any depth")
    if bad:
        pytest.fail("zgtrain/pipeline/code.py names code its stages do not run:\n" + "\n".join(bad))


LONG_FUNCTION = 60  # lines, docstring included
MOST_LONG = 5


def long_functions(root: Path, packages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(lines, path:line name) of every function over LONG_FUNCTION lines in the packages' modules (the shipped
    student modeling templates, copied into each student folder, excepted)."""
    out = []
    for f in modules(root, packages).values():
        if "templates" in f.parts:
            continue
        for node in nodes(f):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > LONG_FUNCTION:
                    out.append((n, f"{f.relative_to(root)}:{node.lineno} {node.name}"))
    return sorted(out, reverse=True)


def test_the_long_function_count_sees_a_long_function(tmp_path):
    (tmp_path / "pk").mkdir()
    (tmp_path / "pk" / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_FUNCTION))
    (tmp_path / "pk" / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}")
    assert long_functions(tmp_path, ("pk",)) == [(LONG_FUNCTION + 1, "pk/m.py:5 long")]


def test_few_functions_are_long():
    found = long_functions(REPO, PACKAGES)
    if len(found) > MOST_LONG:
        pytest.fail(
            f"{len(found)} functions are over {LONG_FUNCTION} lines, at most {MOST_LONG} may be (split one into "
            "named steps):\n" + "\n".join(f"{n:4d} {where}" for n, where in found)
        )


LONG_MODULE = 400  # lines: modules stay at 100-400 lines (docs/ARCHITECTURE.md)
MOST_LONG_MODULES = 8  # the modules over it today; a split lowers this, a new long module fails
GENERATED = f"# generated by `{docs_ref.COMMAND}`"  # the first line of what docs_ref writes (cli_help.py)


def long_modules(root: Path, packages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(lines, path) of every module of the packages over LONG_MODULE lines, but the help pages
    `python -m zgtrain.docs_ref` generates (zgtrain/cli_help.py: typer's text, not code)."""
    out = []
    for f in modules(root, packages).values():
        text = f.read_text()
        if text.startswith(GENERATED):
            continue
        if (n := len(text.splitlines())) > LONG_MODULE:
            out.append((n, str(f.relative_to(root))))
    return sorted(out, reverse=True)


def test_the_long_module_count_sees_a_long_module(tmp_path):
    (tmp_path / "pk").mkdir()
    (tmp_path / "pk" / "__init__.py").write_text("")
    (tmp_path / "pk" / "short.py").write_text("x = 1\n" * LONG_MODULE)
    (tmp_path / "pk" / "long.py").write_text("x = 1\n" * (LONG_MODULE + 1))
    generated = f"{GENERATED} from typer's tree\n" + "x = 1\n" * LONG_MODULE
    (tmp_path / "pk" / "pages.py").write_text(generated)
    assert long_modules(tmp_path, ("pk",)) == [(LONG_MODULE + 1, "pk/long.py")]


def test_few_modules_are_long():
    found = long_modules(REPO, PACKAGES)
    if len(found) > MOST_LONG_MODULES:
        pytest.fail(
            f"{len(found)} modules are over {LONG_MODULE} lines, at most {MOST_LONG_MODULES} may be (move a "
            "coherent part into a module of its own):\n" + "\n".join(f"{n:4d} {where}" for n, where in found)
        )


def _env_uses(name: str, tree: ast.AST) -> list[int]:
    """Lines where the environment variable ``name`` is read or set by its literal key (``environ[name]``,
    ``environ.get/setdefault/pop(name)``, ``getenv(name)``, ``environ.update({name: ...})``), or where runtime's
    constant for it, ``DEVICE_ENV``, is used."""
    lines = []
    for node in ast.walk(tree):
        keys = []
        if isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
            keys = [node.slice]
        elif isinstance(node, ast.Call) and node.args:
            f = ast.unparse(node.func)
            if f.endswith(("environ.get", "environ.setdefault", "environ.pop", "getenv")):
                keys = [node.args[0]]
            elif f.endswith("environ.update") and isinstance(node.args[0], ast.Dict):
                keys = node.args[0].keys
        elif isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
            named = (
                node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
            )
            if named == "DEVICE_ENV":
                lines.append(node.lineno)
        if any(isinstance(k, ast.Constant) and k.value == name for k in keys):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_device_selection_stays_in_runtime():
    """ZG_DEVICE is read and set only by zgdata/core/runtime.py (the brief: device selection in one place), in the
    packages and in the bench scripts (the GPU script among them)."""
    probe = 'import os\nos.environ.get("ZG_DEVICE", "cpu")\nos.environ["ZG_DEVICE"] = "x"\nos.environ.update({"ZG_DEVICE": 1})\n'
    probe += "from zgdata.core.runtime import DEVICE_ENV\nos.environ[DEVICE_ENV]\n"
    assert _env_uses("ZG_DEVICE", ast.parse(probe)) == [2, 3, 4, 5, 6]
    found = [
        f"{path.relative_to(REPO)}:{line}"
        for pkg in (*PACKAGES, "bench")
        for path in sorted((REPO / pkg).rglob("*.py"))
        if path != REPO / "zgdata" / "core" / "runtime.py"
        for line in _env_uses("ZG_DEVICE", ast.parse(path.read_text()))
    ]
    assert not found, (
        f"ZG_DEVICE used outside zgdata/core/runtime.py (use device(), device_type(), set_device()): {found}"
    )
