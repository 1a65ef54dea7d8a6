"""The module-level import graph: no circles in the RPC layers, and lower layers never
import higher ones (DESIGN: autograd < ops < nn/optim < rpc < distributed)."""
import ast
import pathlib

import pytest

pytestmark = pytest.mark.timeout(60)

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "distgrad"


def _module_name(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path, name):
    """Modules of distgrad imported at module level (not inside functions) by ``path``."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in tree.body:
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            if t == "distgrad" or t.startswith("distgrad."):
                out.add(t)
    return out


def _graph():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = _imports(path, name)
        # ``from pkg import sub`` imports sub; pkg itself counts only for names it defines,
        # and a module's own ancestors are already imported before it runs
        graph[name] = {t for t in targets if t in modules and t != name
                       and not name.startswith(t + ".")
                       and not any(u.startswith(t + ".") and u in modules for u in targets)}
    return graph


def _cycles(graph, within):
    """Strongly connected components with more than one module, restricted to ``within``."""
    nodes = [n for n in graph if n.startswith(within)]
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if not w.startswith(within):
                continue
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
                out.append(sorted(comp))
    for v in nodes:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("within", ["distgrad.rpc", "distgrad.distributed", "distgrad.codec",
                                    "distgrad.offload", "distgrad.testing", "distgrad.launch"])
def test_no_import_circles(within):
    assert _cycles(_graph(), within) == []


LAYERS = [  # a module may import its own layer and the ones before it, never a later one
    ("distgrad.codec", "distgrad.references", "distgrad.futures", "distgrad.utils.tempdirs",
     "distgrad.utils.hooks", "distgrad.utils.ports"),
    ("distgrad.autograd",),
    ("distgrad.ops",),
    ("distgrad.nn", "distgrad.optim", "distgrad.distributions"),
    ("distgrad.rpc",),
    ("distgrad.distributed",),
]


def _layer(name):
    for i, prefixes in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return i
    return None


def test_lower_layers_never_import_higher_ones():
    bad = []
    for name, targets in _graph().items():
        mine = _layer(name)
        if mine is None:
            continue
        for t in targets:
            theirs = _layer(t)
            if theirs is not None and theirs > mine:
                bad.append(f"{name} -> {t}")
    assert bad == []
