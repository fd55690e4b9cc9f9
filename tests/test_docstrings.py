"""The API reference's docstrings are in one style the generator renders
(Google style, through napoleon): every function and method on the API page
names each of its parameters under `Args:` and has a `Returns:` section
(unless it returns None); every dataclass or NamedTuple names each field
under `Attributes:`; every other class names its constructor's parameters
under `Args:`."""
import dataclasses
import importlib
import inspect
import os
import re

import pytest

from conftest import REPO

API = open(os.path.join(REPO, "docs", "reference", "api.md"), encoding="utf-8").read()
# (kind, dotted name) of every autodoc entry, its :members: as methods
ENTRIES = []
for kind, name, members in re.findall(
        r"^\.\. auto(function|class):: (\S+)\n(?:   :members: (.*)\n)?", API, re.M):
    ENTRIES.append((kind, name))
    ENTRIES += [("function", f"{name}.{m.strip()}") for m in members.split(",") if m.strip()]


def resolve(dotted):
    """The object a dotted name names, as autodoc finds it (a submodule is
    imported when its package does not import it)."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        if not hasattr(obj, part) and inspect.ismodule(obj):
            importlib.import_module(".".join(parts[:i + 1]))
        obj = getattr(obj, part)
    return obj


def section(doc, title):
    """The names a Google-style section lists (`name:` or `name (type):`)."""
    m = re.search(rf"^{title}:\n((?:[ \t]+.*\n?|\n)*)", doc, re.M)
    if not m:
        return None
    return set(re.findall(r"^    \**(\w+)(?: \(.*\))?:", m.group(1), re.M))


def documented_names(obj):
    """What must be listed, and under which section."""
    if dataclasses.is_dataclass(obj):
        fields = [f.name for f in dataclasses.fields(obj)]
        return "Attributes", [f for f in fields if f not in ("parent", "name")]  # flax's own
    if hasattr(obj, "_fields"):  # a NamedTuple
        return "Attributes", list(obj._fields)
    sig = inspect.signature(obj.__init__ if inspect.isclass(obj) else obj)
    return "Args", [p.name for p in sig.parameters.values()
                    if p.name not in ("self", "cls")
                    and not (inspect.isclass(obj) and p.kind in (p.VAR_POSITIONAL,
                                                                  p.VAR_KEYWORD))]


def test_the_api_page_has_entries():
    assert len(ENTRIES) > 40  # the regex still reads the page


@pytest.mark.parametrize("kind,name", ENTRIES, ids=[n for _, n in ENTRIES])
def test_docstring_is_google_style(kind, name):
    obj = resolve(name)
    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    if inspect.isclass(obj) and issubclass(obj, BaseException):
        return  # an error: its one line says when it is raised
    title, names = documented_names(obj)
    if not names:
        return
    listed = section(doc, title)
    assert listed is not None, f"{name}: no {title}: section"
    assert set(names) - listed == set(), f"{name}: {title}: does not list them"
    assert listed - set(names) == set(), f"{name}: {title}: lists names it does not take"
    if kind == "function":
        returns = inspect.signature(obj).return_annotation
        if returns not in (None, "None"):
            assert re.search(r"^(Returns|Yields):\n", doc, re.M), f"{name}: no Returns:"
