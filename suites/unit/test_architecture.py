"""The package's shape: imports flow one way (no cycles, module-level or inside functions),
and the model at the bottom knows no registry."""
from __future__ import annotations

import ast
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
    out.discard(name)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(path, name, known) for name, path in mods.items()}


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
    from testbed.attachments import netns
    names = {*attachments.names(), *netns.connections(), "macvtap", "ovs", "bridge", "vxlan", "macvlan"}
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
