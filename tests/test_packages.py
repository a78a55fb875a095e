"""Each package says what it is: its ``__init__`` docstring has a reading order that
names every module (and subpackage) it holds, and the import rules it states are the
ones its code keeps. One case per package, found by walking ``src/pion``, so a package
or module added anywhere is checked without editing this file.

A module ``m`` of package ``pion.p`` is named as ``m.py``, ````m````, or ``pion.p.m``
(``:mod:`~pion.p.m```), anywhere after the words "reading order".

An import rule is a sentence of the docstring that says what the package imports, in
one of three forms, naming modules of ``pion`` in double backquotes (````errors````,
````pion.server````; other words are prose):

- "imports only ``a``, ``b`` ..." or "depends on ``a`` ...": nothing else of ``pion``;
- "imports nothing else from ``pion`` except ``a``": the same;
- "never imports ``x``": not ``x``, directly or lazily.

Imports are read with ``ast`` from every module of the package, those inside functions
included (a lazy import is still a dependency); only an ``if TYPE_CHECKING:`` body is
left out, as it never runs. A package that states no rule is checked for its reading
order only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "src" / "pion"
PACKAGES = sorted(p.parent for p in PKG.rglob("__init__.py"))
# The top-level names of pion: the unit an import rule speaks of.
TOP = {p.stem for p in PKG.glob("*.py")} | {p.name for p in PKG.iterdir() if p.is_dir()}


def _dotted(package: Path) -> str:
    return ".".join(package.relative_to(PKG.parent).parts)


def _docstring(package: Path) -> str:
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text()))
    assert doc, f"{_dotted(package)}/__init__.py has no docstring"
    return doc


def _members(package: Path) -> list[str]:
    """The package's modules and subpackages, by name."""
    modules = [p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")]
    subpackages = [p.name for p in package.iterdir() if (p / "__init__.py").is_file()]
    return sorted(modules + subpackages)


def _named(text: str, dotted: str, member: str) -> bool:
    m = re.escape(member)
    return bool(
        re.search(rf"(?<![\w.]){m}(\.py|/)(?!\w)", text)
        or re.search(rf"``{m}``", text)
        or re.search(rf"(?<![\w.]){re.escape(dotted)}\.{m}(?![\w])", text)
    )


@pytest.mark.parametrize("package", PACKAGES, ids=_dotted)
def test_the_reading_order_names_every_module(package: Path) -> None:
    doc = _docstring(package)
    at = doc.lower().find("reading order")
    assert at >= 0, f"{_dotted(package)}/__init__.py: no reading order in its docstring"
    order = doc[at:]
    missing = [m for m in _members(package) if not _named(order, _dotted(package), m)]
    assert not missing, f"{_dotted(package)}'s reading order does not name {missing}"


# --- import rules ---------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    sentence: str
    only: frozenset[str] | None  # the top-level names allowed (besides the package)
    never: frozenset[str]


_ONLY = re.compile(r"imports only|depends on|imports nothing else from ``pion`` except", re.I)
_NEVER = re.compile(r"never imports", re.I)


def _names(text: str) -> frozenset[str]:
    out = set()
    for quoted in re.findall(r"``([\w.]+)``", text):
        parts = quoted.removeprefix("pion.").split(".")
        if parts[0] in TOP:
            out.add(parts[0])
    return frozenset(out)


def rules(doc: str) -> list[Rule]:
    """The import rules a docstring states (see the module docstring)."""
    found = []
    flat = " ".join(doc.split())
    for sentence in re.split(r"(?<=\.)\s+", flat):
        # One sentence may state both: "imports only a and b: never c".
        never, only = _NEVER.search(sentence), _ONLY.search(sentence)
        end = never.start() if never else len(sentence)
        if only and only.start() < end:
            found.append(Rule(sentence, _names(sentence[only.start() : end]), frozenset()))
        if never:
            found.append(Rule(sentence, None, _names(sentence[never.start() :])))
    return found


def _type_checking_only(tree: ast.Module) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skip.update(id(n) for n in ast.walk(stmt))
    return skip


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, top-level pion name) of every pion import of a module."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_only(tree)
    here = path.relative_to(PKG.parent).with_suffix("").parts
    package = here[:-1]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            # ``from pion import x``: x is the module imported.
            names = [f"{module}.{a.name}" for a in node.names] if module == "pion" else [module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "pion" and len(parts) > 1 and parts[1] in TOP:
                yield node.lineno, parts[1]


def _own(package: Path) -> str:
    return package.relative_to(PKG).parts[0] if package != PKG else ""


@pytest.mark.parametrize("package", PACKAGES, ids=_dotted)
def test_the_stated_import_rules_hold(package: Path) -> None:
    stated = rules(_docstring(package))
    own = _own(package)
    broken = []
    for path in sorted(package.rglob("*.py")):
        for line, name in imports(path):
            if name == own:
                continue
            for rule in stated:
                if name in rule.never or (rule.only is not None and name not in rule.only):
                    where = path.relative_to(ROOT)
                    broken.append(f"{where}:{line} imports pion.{name}; {rule.sentence!r}")
    assert not broken, "\n".join(broken)


def test_the_rules_are_read_as_written() -> None:
    both = "Imports only ``wire`` and ``export``: it never imports ``pion.server``."
    assert rules(both) == [
        Rule(both, frozenset({"wire", "export"}), frozenset()),
        Rule(both, None, frozenset({"server"})),
    ]
    doc = (
        "Synchronous: imports only ``errors`` and ``watch``. The commands are "
        "``pion.commands``'s. This package never imports ``pion.server``, nor "
        "``redis``. It imports nothing else from ``pion`` except ``pion.errors``."
    )
    assert rules(doc) == [
        Rule(
            "Synchronous: imports only ``errors`` and ``watch``.",
            frozenset({"errors", "watch"}),
            frozenset(),
        ),
        Rule(
            "This package never imports ``pion.server``, nor ``redis``.",
            None,
            frozenset({"server"}),
        ),
        Rule(
            "It imports nothing else from ``pion`` except ``pion.errors``.",
            frozenset({"errors"}),
            frozenset(),
        ),
    ]
    found = list(imports(PKG / "attend" / "widen.py"))  # its import in a TYPE_CHECKING else
    assert (28, "codecs") in found


# --- no import circle -------------------------------------------------------------------


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_graph() -> dict[str, set[str]]:
    """Each module of pion -> the modules of pion it imports (anywhere in it, typing
    imports included: a circle there is still two modules that need each other)."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                found.add(module)
                found.update(f"{module}.{a.name}" for a in node.names)
        # A module's own package (its __init__) runs before it: not an edge.
        graph[name] = {
            m for m in found if m in modules and m != name and not name.startswith(m + ".")
        }
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while (w := stack.pop()) != v:
                group.append(w)
            if group:
                out.append(sorted([v, *group]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_modules_import_each_other() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles(_module_graph()) == []
