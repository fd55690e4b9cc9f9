"""The package's architecture as data, and the import graph read from the
code: `LAYERS` (lowest first) is what docs/layout.md shows and what
tests/test_layout.py holds the code to (no import from a lower layer to a
higher one, no cycle, no private name reached across modules). `{layout-tree}`
prints the tree with each module's first docstring line, so the page cannot
drift from the code."""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# (name, what it is): lowest first; a package or a top-level module of elmo_jax
LAYERS = [
    [("errors", "every error of a user's mistake"), ("environment", "the process's environment variables"),
     ("private_apis", "the private jax and orbax APIs, version-checked")],
    [("storage", "paths local and in buckets, whole writes, local copies")],
    [("core", "the pure model: options, spelling, vocabulary, kernels, biLM, embed, softmax")],
    [("config", "a run's configuration")],
    [("formats", "weights, exports, serving artifacts, checkpoints, published models, open_model")],
    [("data", "text, tokenisation, prepared tokens, training batches, corpus recipes")],
    [("corpus", "the corpus job and its embedding store"), ("training", "the training run"),
     ("api", "what a user embeds with: Elmo, the Flax modules, scores")],
    [("cli", "the commands, and everything that owns the process")],
    [("tasks", "downstream tasks with their own commands")],
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name, _ in layer}


def modules(root: str = ROOT) -> dict[str, str]:
    """{dotted module name: file} for every module of elmo_jax."""
    out = {}
    for folder, dirs, names in os.walk(os.path.join(root, "elmo_jax")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


def imports(path: str, dotted: str, known: dict) -> list[tuple[str, list[str]]]:
    """[(imported elmo_jax module, [names taken from it])] of one file;
    `from pkg import submodule` is an import of the submodule."""
    package = dotted if path.endswith("__init__.py") else dotted.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name in known]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module not in known:
                continue
            names = []
            for a in node.names:
                if f"{module}.{a.name}" in known:
                    out.append((f"{module}.{a.name}", []))
                else:
                    names.append(a.name)
            if names:
                out.append((module, names))
    return out


def graph(root: str = ROOT) -> dict[str, set[str]]:
    """{module: the elmo_jax modules it imports}, itself excluded."""
    known = modules(root)
    return {m: {t for t, _ in imports(p, m, known) if t != m} for m, p in known.items()}


def layer_of(dotted: str) -> str:
    """The layer entry a module belongs to: its package or top-level module."""
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] != "__main__" else ""


def first_sentence(doc: str, width: int = 96) -> str:
    """A docstring's first sentence on one line, cut at a word to `width`."""
    text = " ".join(doc.split("\n\n")[0].split())
    text = text.split(". ")[0].rstrip(".:")
    if len(text) > width:
        text = text[:width].rsplit(" ", 1)[0] + " ..."
    return text


def tested_by(root: str = ROOT) -> dict[str, list[str]]:
    """{module: the test files that import it}."""
    known = modules(root)
    out: dict[str, list[str]] = {m: [] for m in known}
    folder = os.path.join(root, "tests")
    for name in sorted(os.listdir(folder)):
        if name.startswith("test_") and name.endswith(".py"):
            path = os.path.join(folder, name)
            for target, _ in imports(path, "tests." + name[:-3], known):
                if name not in out[target]:
                    out[target].append(name)
    return out


def tree_lines(root: str = ROOT) -> list[str]:
    """The package tree, one line a module or package, with the first line of
    its docstring."""
    lines = []
    for dotted, path in modules(root).items():
        if dotted.endswith("__main__"):
            continue
        doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
        first = first_sentence(doc) if dotted != "elmo_jax" else "the public API (`elmo_jax.__all__`)"
        depth = dotted.count(".")
        shown = dotted.rpartition(".")[2] + ("/" if path.endswith("__init__.py") else ".py")
        if dotted == "elmo_jax":
            shown = "elmo_jax/"
        lines.append(f"{'  ' * depth}{shown:<{26 - 2 * depth}} {first}")
    return lines


def setup(app):
    from docutils import nodes
    from docutils.parsers.rst import Directive

    class LayoutTree(Directive):
        def run(self):
            text = "\n".join(tree_lines())
            return [nodes.literal_block(text, text)]

    class LayoutLayers(Directive):
        def run(self):
            text = "\n".join(f"{i}  " + ", ".join(name for name, _ in layer) + "   ("
                             + "; ".join(what for _, what in layer) + ")"
                             for i, layer in reversed(list(enumerate(LAYERS))))
            return [nodes.literal_block(text, text)]

    class LayoutTests(Directive):
        def run(self):
            rows = [f"{m:<34} {', '.join(t) or '(through the public API or a command)'}"
                    for m, t in tested_by().items() if not m.endswith("__main__")]
            text = "\n".join(rows)
            return [nodes.literal_block(text, text)]

    app.add_directive("layout-tree", LayoutTree)
    app.add_directive("layout-tests", LayoutTests)
    app.add_directive("layout-layers", LayoutLayers)
    return {"parallel_read_safe": True}
