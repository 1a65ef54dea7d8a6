"""The import graph: the layers of docs/architecture.md hold (that table is the rule; this
test reads it), no circles (imports inside functions and ties to a package's own
``__init__`` included), and tensor internals only through their declared door,
``distgrad/autograd/_internal.py``.

An import is anything that ties one module to another: ``import``/``from`` statements at
the top or inside functions, ``importlib.import_module`` with a constant name, and a
string constant that names a module of distgrad exactly (``"distgrad.nn"``, an allowlist
entry ``"distgrad.nn.*"``, a reference ``"distgrad.nn:Linear"``), docstrings and logger
names aside. An ``import_module`` whose name is computed at run time is listed in
DYNAMIC_IMPORTS with what it loads.
"""
import ast
import functools
import pathlib
import re

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distgrad"
ARCHITECTURE = ROOT / "docs" / "architecture.md"

# Imports that stay inside functions in the engine core, each with the reason it cannot
# move to the top.
DEFERRED_ALLOWED = {
    ("distgrad.utils.data.worker", "distgrad.ops.creation"):
        "runs in a DataLoader worker process only, which seeds distgrad's generator there",
}
# import_module calls whose module is named at run time: where, and what they load.
DYNAMIC_IMPORTS = {
    "distgrad.utils.lazy": "a package's own subpackages, on first attribute access",
    "distgrad.cli": "the chosen command's module, from the COMMANDS table above it",
    "distgrad.rpc.allowlist": "the module of a reference a peer sent, once allowed",
    "distgrad.serialization": "the module of a class a checkpoint names, once allowed",
    "distgrad.compat.as_torch": "the module a program imports as torch.*",
    "distgrad.testing.forkserver": "the test modules a world's workers import",
    "distgrad.launch.resolve": "the module:function references of a config",
    "distgrad.testing.host_call": "the module of a function a test runs on a simulated host",
}
# Where the check of private tensor attributes does not apply yet, and why.
PRIVATE_ACCESS_PENDING = {}
# Tensor (and graph node) attributes that only distgrad/autograd may touch.
PRIVATE_TENSOR_ATTRIBUTES = {
    "_data", "_vc", "_grad_fn", "_requires_grad", "_output_nr", "_base", "_grad",
    "_is_inference", "_grad_accumulator", "_view_fn", "_retains_grad", "_post_acc_hooks",
    "_grad_edge", "_base_tensor", "_is_view", "_wrap", "_next", "_out_meta",
}
_MODULE_STRING = re.compile(r"^(distgrad(?:\.\w+)+)(?:\.\*|:[\w.]+)?$")


def _module_name(path):
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) \
                and node.body and isinstance(node.body[0], ast.Expr) \
                and isinstance(node.body[0].value, ast.Constant):
            out.add(id(node.body[0].value))
    return out


def _is_import_module(call):
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "import_module" or \
        isinstance(f, ast.Name) and f.id == "import_module"


def _is_logger(call):
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr == "getLogger"


def _resolve(base, level, name, is_pkg):
    if not level:
        return base
    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
    pkg = pkg[:len(pkg) - (level - 1)]
    return ".".join(pkg + ([base] if base else []))


def _imports(path, name, modules, deferred_only=False):
    """``{module of distgrad: how}`` that ``path`` imports; ``how`` is "import",
    "deferred" (inside a function), "import_module", "string" or "dynamic" (an
    import_module whose name is computed: its target is the importer itself).

    ``from pkg import sub`` imports ``sub``; ``from pkg import name`` ties the importer to
    ``pkg`` itself, also when ``pkg`` is the importer's own package (its ``__init__``
    imports the rest of it, so the tie is a circle in waiting).
    """
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    docstrings = _docstrings(tree)
    skip = set(docstrings)
    is_pkg = path.name == "__init__.py"
    out = {}

    def add(target, how):
        if target in modules and target != name:
            out.setdefault(target, how)

    for node in ast.walk(tree):
        how = "import" if id(node) in top_level else "deferred"
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, how)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, name, is_pkg)
            if base not in modules:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, how)
        elif isinstance(node, ast.Call) and _is_logger(node):
            skip.update(id(a) for a in node.args)
        elif isinstance(node, ast.Call) and _is_import_module(node) and node.args:
            first = node.args[0]
            skip.add(id(first))
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                target = first.value
                if target.startswith("."):
                    level = len(target) - len(target.lstrip("."))
                    package = name if is_pkg else name.rsplit(".", 1)[0]
                    target = _resolve(target.lstrip("."), level, package + ".x", False)
                add(target, "import_module")
            else:
                out.setdefault(name, "dynamic")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in skip:
            match = _MODULE_STRING.match(node.value)
            if match:
                add(match.group(1), "string")
    if deferred_only:
        out = {t: how for t, how in out.items() if how == "deferred"}
    return out


@functools.lru_cache(maxsize=None)
def _graph(deferred_only=False):
    """``{module: {imported module: how}}``; a dynamic import shows as the module itself."""
    modules = _modules()
    return {name: _imports(path, name, modules, deferred_only) for name, path in modules.items()}


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
            if w == v or not w.startswith(within):
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


def _table():
    """The layers of docs/architecture.md, top to bottom: [(layer, module prefixes,
    layers it may import)]; its last column reads "all below", "none" (its own layer
    only) or names layers below it."""
    rows = []
    for line in ARCHITECTURE.read_text().split("## Layers", 1)[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or cells[0] in ("Layer", "") or set(cells[0]) <= set("-: "):
            if rows and not line.startswith("|"):
                break
            continue
        rows.append((cells[0], re.findall(r"`([\w.]+)`", cells[1]), cells[3]))
    names = [layer for layer, _, _ in rows]
    table = []
    for i, (layer, prefixes, may) in enumerate(rows):
        below = names[i + 1:] if may == "all below" else [] if may == "none" else \
            [m.strip().strip("`") for m in may.split(",")]
        unknown = [b for b in below if b not in names[i + 1:]]
        assert not unknown, f"architecture.md: {layer} may import {unknown}: no such layer below"
        table.append((layer, prefixes, set(below) | {layer}))
    return table


def _layer_of(name, table):
    best = None
    for layer, prefixes, _ in table:
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and \
                    (best is None or len(prefix) > len(best[1])):
                best = (layer, prefix)
    return best[0] if best else None


@pytest.mark.parametrize("within", ["distgrad.autograd", "distgrad.ops", "distgrad.nn",
                                    "distgrad.optim", "distgrad.utils", "distgrad.distributions",
                                    "distgrad.rpc", "distgrad.distributed", "distgrad.codec",
                                    "distgrad.offload", "distgrad.testing", "distgrad.launch",
                                    "distgrad.multiprocessing", "distgrad.sparse", "distgrad"])
def test_no_import_circles(within):
    """Imports only: a module named in a string (the module a world's workers allow, say)
    is a tie of layers, and counts there, but naming a module runs none of it."""
    imports = {name: {t: how for t, how in targets.items() if how != "string"}
               for name, targets in _graph().items()}
    assert _cycles(imports, within) == []


@pytest.mark.parametrize("within", ["distgrad.autograd", "distgrad.ops"])
def test_no_deferred_imports_in_the_engine_core(within):
    """An import inside a function hides a circle or costs a lookup per call; the engine
    core has none (the lower layer offers a slot, the higher one installs itself)."""
    found = [f"{name} -> {t}" for name, targets in _graph(deferred_only=True).items()
             if name.startswith(within) for t in sorted(targets)
             if (name, t) not in DEFERRED_ALLOWED]
    assert found == []


def test_every_module_has_a_layer():
    table = _table()
    homeless = sorted(name for name in _modules() if _layer_of(name, table) is None)
    assert homeless == [], "add them to the table of docs/architecture.md"


def test_no_module_imports_a_layer_above_its_own():
    """Every tie (an import at the top or inside a function, import_module, a module named
    in a string) goes to the importer's own layer or one its row allows."""
    table = _table()
    allowed = {layer: may for layer, _, may in table}
    bad = []
    for name, targets in _graph().items():
        mine = _layer_of(name, table)
        for target, how in sorted(targets.items()):
            theirs = _layer_of(target, table)
            if target != name and theirs not in allowed[mine]:
                bad.append(f"{name} ({mine}) -> {target} ({theirs}) by {how}")
    assert bad == []


def test_computed_imports_are_declared():
    found = sorted(name for name, targets in _graph().items() if name in targets)
    assert found == sorted(DYNAMIC_IMPORTS), "import_module with a computed name: declare it"


def test_the_checks_see_what_they_should():
    graph = _graph()
    table = _table()
    assert graph["distgrad.utils.data.distributed"] is not None
    assert _layer_of("distgrad.utils.data.sampler", table) == "library"
    assert _layer_of("distgrad.utils.ports", table) == "foundation"
    probe = _imports(PACKAGE / "cli.py", "distgrad.cli", _modules())
    assert probe.get("distgrad.launch.command") == "string"


def _private_uses(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_TENSOR_ATTRIBUTES:
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and "autograd" in (node.module or "").split("."):
            for alias in node.names:
                if alias.name.startswith("_") and alias.name != "_internal" and \
                        not node.module.endswith("._internal"):
                    yield node.lineno, f"import of {alias.name} from {node.module}"


def test_tensor_internals_only_through_their_door():
    """Outside distgrad/autograd, a tensor's private attributes and autograd's underscore
    names are reached through ``autograd/_internal.py`` only."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        if rel.startswith("distgrad/autograd/") or any(
                rel.startswith(prefix) for prefix in PRIVATE_ACCESS_PENDING):
            continue
        bad += [f"{rel}:{line}: {what}" for line, what in _private_uses(path)]
    assert bad == []


def test_private_access_check_sees_what_it_should():
    probe = PACKAGE / "autograd" / "engine.py"  # inside autograd, so it uses internals
    assert any(what.endswith("._data") for _, what in _private_uses(probe))


def test_no_module_adds_to_the_tensor_class():
    """distgrad.Tensor is made in one place (distgrad/_tensor.py, from the method sets of
    its bases): no module assigns or setattr's an attribute of it, or of its core class,
    after the fact."""
    names = {"Tensor", "TensorBase"}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            hit = any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and
                      t.value.id in names for t in targets)
            hit = hit or (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
                          node.func.id == "setattr" and node.args and
                          isinstance(node.args[0], ast.Name) and node.args[0].id in names)
            if hit:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert found == []
