"""The package's shape: imports flow one way (no cycles, module-level or inside functions,
including the modules a registry loads by name), folders keep their layers, and the model at
the bottom knows no registry."""
from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import testbed

PKG = Path(testbed.__file__).resolve().parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, name: str, known: set[str]) -> set[str]:
    """Every testbed module ``path`` imports, at module level or inside a function (an
    import placed in a function to dodge a cycle is still a cycle), except those made only
    for type checkers."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for t in ast.walk(tree) if _type_checking_only(t) for n in ast.walk(t)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out |= _registry_imports(tree, name, known)
    out.discard(name)
    return out


def _literal_modules(tree: ast.AST) -> tuple[str, ...] | None:
    """The ``MODULES = ("a", "b", ...)`` tuple of a registry module, or None."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "MODULES" for t in targets) and \
                    isinstance(node.value, (ast.Tuple, ast.List)):
                return tuple(e.value for e in node.value.elts
                             if isinstance(e, ast.Constant) and isinstance(e.value, str))
    return None


def _registry_imports(tree: ast.AST, name: str, known: set[str]) -> set[str]:
    """What a module loads by name (importlib.import_module, __import__): the modules of the
    ``MODULES`` list it reads (its own, or one it imports from its registry: a bare name is
    a module of the registry's package), else, for a name built from a constant prefix
    (``f"testbed.scenarios.{x}"``), every module under that prefix."""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and (
        (isinstance(n.func, ast.Attribute) and n.func.attr == "import_module")
        or (isinstance(n.func, ast.Name) and n.func.id in ("import_module", "__import__")))]
    if not calls:
        return set()
    registry, listed = name, _literal_modules(tree)
    if listed is None:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and any(a.name == "MODULES" for a in node.names) \
                    and node.module in known:
                registry = node.module
                listed = _literal_modules(ast.parse(_modules()[registry].read_text()))
    out: set[str] = set()
    if listed is not None:
        for m in listed:
            full = m if "." in m else f"{registry}.{m}"
            out |= {full} & known
        return out
    for c in calls:
        arg = c.args[0] if c.args else None
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            prefix = str(arg.values[0].value)
            out |= {k for k in known if k.startswith(prefix) and k != name}
    return out


def _graph() -> dict[str, set[str]]:
    return {k: set(v) for k, v in _graph_of(PKG).items()}


@functools.cache
def _graph_of(pkg: Path) -> dict[str, frozenset[str]]:
    # read once per package folder: the tests here share it (a test's own PKG gets its own)
    mods = _modules()
    known = set(mods)
    return {name: frozenset(_imports(path, name, known)) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_reader_sees_the_imports_it_must():
    g = _graph()
    # a module-level import, a function-level one and a relative one are all seen
    assert "testbed.topology.model" in g["testbed.topology.config"]
    assert "testbed.attachments" in g["testbed.topology.config"]
    assert "testbed.attachments.base" in g["testbed.attachments"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_in_the_package():
    cycles = _cycles(_graph())
    assert cycles == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


#: The package's layers, bottom up. A place is a folder of testbed/ or a module named by its
#: path; it imports only from places of its own layer (without a cycle between them) or
#: below. The floor: the model every layer passes along and the one reader of a user's YAML.
#: topology/ above the registries: its reader (config) validates names against them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("testbed", "errors", "lazy", "topology/model", "topology/yamlnode"),
    ("host",),
    ("records",),
    ("tools",),
    ("analysis",),
    ("guests",),
    ("attachments",),
    ("admin",),
    ("topology",),
    ("measure",),
    ("fleet", "scenarios", "bench"),
    ("api",),
    ("cli", "pytest_plugin", "pytest_workers", "__main__"),
    ("_suite_plugin",),             # this project's own test machinery, on the public plugin
)


def _place(module: str, places: set[str]) -> str:
    rel = module.split(".")[1:]
    if not rel:
        return "testbed"
    two = "/".join(rel[:2])
    return two if two in places else rel[0]


def _layer_breaks(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Imports that go up a layer, or to a place no layer lists."""
    level = {p: i for i, layer in enumerate(layers) for p in layer}
    found = []
    for a, targets in sorted(graph.items()):
        pa = _place(a, set(level))
        for b in sorted(targets):
            pb = _place(b, set(level))
            if pa == pb:
                continue
            if pa not in level or pb not in level:
                found.append(f"{a} -> {b}: {pa if pa not in level else pb} is in no layer")
            elif level[pb] > level[pa]:
                found.append(f"{a} ({pa}) -> {b} ({pb}): up from layer {level[pa]} to {level[pb]}")
    return found


def _folder_graph(graph: dict[str, set[str]], layers=LAYERS) -> dict[str, set[str]]:
    places = {p for layer in layers for p in layer}
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            pa, pb = _place(a, places), _place(b, places)
            if pa != pb:
                out.setdefault(pa, set()).add(pb)
    return out


def test_the_reader_sees_what_the_registries_load():
    g = _graph()
    # attachments/__init__ and tools/__init__ load their MODULES by name; scenarios by a prefix
    assert {"testbed.attachments.bridge", "testbed.attachments.macvtap", "testbed.attachments.netns"} \
        <= g["testbed.attachments"]
    assert {"testbed.tools.netperf", "testbed.tools.iperf3"} <= g["testbed.tools"]
    assert "testbed.scenarios.a_bridge_vs_ovs" in g["testbed.scenarios"]


def test_no_import_cycle_between_folders():
    cycles = _cycles(_folder_graph(_graph()))
    assert cycles == [], "import cycles between folders: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_folders_keep_their_layers():
    found = _layer_breaks(_graph())
    assert found == [], "imports up the layers (suites/unit/test_architecture.py LAYERS): " + "; ".join(found)


def test_the_host_layer_names_no_mode_tool_or_guest():
    g = _graph()
    above = ("testbed.attachments", "testbed.tools", "testbed.guests", "testbed.measure", "testbed.admin")
    found = sorted(f"{a} -> {b}" for a, bs in g.items() if a.startswith("testbed.host")
                   for b in bs if b.startswith(above))
    assert found == [], found


def test_the_layer_check_finds_a_registry_that_loads_upwards(tmp_path, monkeypatch):
    # it must be able to fail: a registry in the floor whose MODULES names a module above it,
    # loaded by importlib (no import statement), is an import up the layers and a cycle
    pkg = tmp_path / "testbed"
    (pkg / "low").mkdir(parents=True)
    (pkg / "high").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "__init__.py").write_text(
        'import importlib\nMODULES = ("testbed.high.mod",)\n'
        'def load():\n    return [importlib.import_module(m) for m in MODULES]\n')
    (pkg / "high" / "__init__.py").write_text("")
    (pkg / "high" / "mod.py").write_text("from testbed import low\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    g = _graph()
    assert g["testbed.low"] == {"testbed.high.mod"}
    layers = (("testbed",), ("low",), ("high",))
    assert _layer_breaks(g, layers) == ["testbed.low (low) -> testbed.high.mod (high): up from layer 1 to 2"]
    assert _cycles(_folder_graph(g, layers)) == [["high", "low"]]


def test_the_model_imports_nothing_above_it():
    # the bottom of the house: the records every layer passes along name no registry, no
    # host operation and no tool; the registries validate names against them instead
    g = _graph()
    assert g["testbed.topology.model"] <= {"testbed"}, g["testbed.topology.model"]


# -- one home per mode and per tool ------------------------------------------------------

#: literals that look like a mode's name but name something else, where they are compared
ALLOWED_LITERALS = {
    ("host/net/ovs.py", "ovs-"),            # the OVS host module: is a datapath string an OVS one
    ("host/snapshot.py", "bridge"),         # a Linux link kind (ip link type), read from the kernel
}


def _literals(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for e in node.elts:
            yield from _literals(e)


def _branches_on(names: set[str], skip: tuple[str, ...]) -> list[str]:
    """Comparisons (==, !=, in) and startswith/endswith calls on one of ``names`` (or a
    ``name-`` prefix of one) in the package's code outside ``skip``."""
    prefixes = {f"{n}-" for n in names}
    found = []
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG).as_posix()
        if rel.startswith(skip):
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            vals: list[str] = []
            if isinstance(node, ast.Compare):
                for side in (node.left, *node.comparators):
                    vals += _literals(side)
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("startswith", "endswith", "removeprefix")):
                for a in node.args:
                    vals += _literals(a)
            hits = [v for v in vals if (v in names or v in prefixes) and (rel, v) not in ALLOWED_LITERALS]
            if hits:
                found.append(f"{rel}:{node.lineno} {hits}")
    return found


def test_no_branch_on_a_mode_name_outside_the_modes():
    from testbed import attachments
    names = {*attachments.names(), *attachments.connections(), "macvtap", "ovs", "bridge", "vxlan", "macvlan"}
    found = _branches_on(names, ("attachments/",))
    assert found == [], "branches on a mode name outside attachments/: " + "; ".join(found)


def test_no_branch_on_a_tool_name_outside_the_tools():
    from testbed import tools
    found = _branches_on({*tools.names(), "nuttcp"}, ("tools/",))
    assert found == [], "branches on a tool name outside tools/: " + "; ".join(found)


def test_the_branch_finder_finds_branches(tmp_path, monkeypatch):
    # it must be able to fail: a module that branches on a mode is found
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text('def f(a):\n    return 1 if a == "ovs" else a.startswith("macvtap-")\n')
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert len(_branches_on({"ovs", "macvtap"}, ())) == 2


_PYROUTE2_SOCKETS = {"IPRoute", "NDB", "IPSet", "IW", "IPBatch", "NetNS", "AsyncIPRoute"}


def _forking_netlink(roots: list[Path]) -> list[str]:
    """Calls that open a pyroute2 socket in a namespace through pyroute2 itself (``netns=``,
    or its NetNS class): pyroute2 forks a copy of the calling process for them, and a fork of
    a process with other threads (a pytest-xdist worker's I/O thread, a run's watchers) hung
    forever in a lock one of them held. ops.iproute opens it from a thread in the namespace."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call):
                    continue
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in _PYROUTE2_SOCKETS and (name == "NetNS" or any(k.arg == "netns" for k in node.keywords)):
                    found.append(f"{path}:{node.lineno}")
    return found


def test_no_pyroute2_socket_is_opened_by_a_fork():
    roots = [PKG, PKG.parent / "suites", PKG.parent / "examples"]
    found = _forking_netlink([r for r in roots if r.is_dir()])
    assert found == [], "pyroute2 netns= forks this process (use ops.iproute): " + "; ".join(found)


def test_the_fork_finder_finds_a_forking_socket(tmp_path):
    (tmp_path / "m.py").write_text("from pyroute2 import IPRoute, NetNS\n"
                                   "a = IPRoute(netns='x', flags=0)\nb = NetNS('y')\nc = IPRoute()\n")
    assert [s.rsplit(":", 1)[1] for s in _forking_netlink([tmp_path])] == ["2", "3"]


# -- the run's spine ----------------------------------------------------------------------

#: the older entry points with positional arguments, kept for callers outside a run
#: (benchmarks, tests): each builds a Context and calls the one loop
OLDER_ENTRY_POINTS = {("measure/sampling.py", n) for n in ("measure_once", "sample_paths", "measure_cell",
                                                           "measure_paths")} | {("measure/ratesearch_cell.py",
                                                                                "measure_cell")}


def _functions(rel: str):
    tree = ast.parse((PKG / rel).read_text())
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_run_is_short_and_takes_few_positional_arguments():
    [execute] = [f for f in _functions("measure/runner.py") if f.name == "execute"]
    assert execute.end_lineno - execute.lineno + 1 <= 80
    wide = []
    for rel in ("measure/run.py", "measure/runner.py", "measure/sampling.py", "measure/context.py",
                "measure/hooks.py", "measure/ratesearch_cell.py", "measure/variants.py", "measure/plan.py"):
        for f in _functions(rel):
            pos = [a.arg for a in f.args.posonlyargs + f.args.args if a.arg not in ("self", "cls")]
            if len(pos) > 5 and (rel, f.name) not in OLDER_ENTRY_POINTS:
                wide.append(f"{rel}:{f.name} ({len(pos)})")
    assert wide == [], wide


def test_every_schedule_of_the_run_goes_through_the_one_loop_with_the_runs_context():
    # the variants once had a loop of their own with a default Watch: their noisy samples
    # were never retried. Every measuring call of the run passes the run's own context.
    calls = [n for n in ast.walk(ast.parse((PKG / "measure/run.py").read_text())) if isinstance(n, ast.Call)
             and ast.unparse(n.func) in ("measure.measure", "measure.fail", "ratesearch_cell.search",
                                         "measure.sample", "measure.settled")]
    assert {ast.unparse(c.func) for c in calls} >= {"measure.measure", "ratesearch_cell.search"}
    assert all(c.args and ast.unparse(c.args[0]) == "self.ctx" for c in calls), [ast.unparse(c) for c in calls]
    for rel in ("measure/variants.py", "measure/run.py"):
        assert "Watch()" not in (PKG / rel).read_text(), rel
