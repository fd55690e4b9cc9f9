"""The package's shape, held to what docs/layout.md says (docs/_ext/layout.py
is both the page's source and these tests'): imports run down the layers,
no cycle, a short top level, no private name reached across modules, and no
function too long to read."""
import ast
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "docs", "_ext"))

import layout  # noqa: E402


def test_every_package_and_top_level_module_has_a_layer():
    entries = {layout.layer_of(m) for m in layout.modules()} - {""}
    assert sorted(entries - set(layout.RANK)) == []
    assert sorted(set(layout.RANK) - entries) == []  # no layer names a module that is gone


def test_imports_run_down_the_layers():
    """A module imports only from its own layer entry or a lower layer; the
    entries of one layer (corpus, training, api) do not import each other."""
    upward = []
    for module, targets in layout.graph().items():
        here = layout.layer_of(module)
        for target in targets:
            there = layout.layer_of(target)
            if here and there and here != there and layout.RANK[there] >= layout.RANK[here]:
                upward.append((module, target))
    assert upward == []


def test_no_import_cycle():
    graph, cycles = layout.graph(), []
    index, low, stack, on_stack = {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def test_at_most_a_dozen_modules_at_the_top():
    top = [m for m, path in layout.modules().items()
           if m.count(".") == 1 and not path.endswith("__init__.py")]
    assert len(top) <= 12, top


def _private_reaches(path: str, known: dict) -> list:
    rel = os.path.relpath(path, REPO)
    mine = rel[:-3].replace(os.sep, ".").removesuffix(".__init__")
    tree = ast.parse(open(path, encoding="utf-8").read())
    aliases, found = {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("elmo_jax"):
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                elif a.name.startswith("_") and not a.name.startswith("__") \
                        and node.module != mine:
                    found.append(f"{rel}:{node.lineno} {node.module}.{a.name}")
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            base = node.value
            owner = (aliases.get(base.id) if isinstance(base, ast.Name) else
                     ast.unparse(base) if isinstance(base, ast.Attribute) else None)
            if owner in known and owner != mine:
                found.append(f"{rel}:{node.lineno} {owner}.{node.attr}")
    return found


def test_no_private_name_is_reached_across_modules():
    """What another module, a bench or a test needs is a public name."""
    known = layout.modules()
    found = []
    for top in ("elmo_jax", "tests", "bench", os.path.join("docs", "_ext")):
        for folder, dirs, names in os.walk(os.path.join(REPO, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            found += [r for n in names if n.endswith(".py")
                      for r in _private_reaches(os.path.join(folder, n), known)]
    assert found == []


def test_the_check_finds_a_private_reach(tmp_path):
    """The test above can fail: a file reaching a private name is found."""
    probe = tmp_path / "probe.py"
    probe.write_text("from elmo_jax.core import embedding\n"
                     "from elmo_jax.core.kernels import _hidden\n"
                     "embedding._secret(1)\n")
    found = _private_reaches(str(probe), layout.modules())
    assert [f.split(" ")[1] for f in found] == ["elmo_jax.core.kernels._hidden",
                                               "elmo_jax.core.embedding._secret"]


def test_every_function_within_its_size():
    """No function over 80 lines, and no `assert` in the library (which
    `python -O` removes: user input is checked with an error). Files are cut
    by responsibility, not by size."""
    long_functions, asserts = [], []
    for dotted, path in layout.modules().items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > 80:
                    long_functions.append((dotted, node.name))
            elif isinstance(node, ast.Assert):
                asserts.append((dotted, node.lineno))
    assert (long_functions, asserts) == ([], [])
