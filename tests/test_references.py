"""The repository stays true to itself: every ``pion.x.y`` name written in code, docs
and README exists, every relative link and file path they give resolves (anchors
included), the README's source tour names every package and module, and the counts
the docs state come from the code. It reads the tree it runs on, so a module, command
or store added anywhere is checked without editing this file."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PKG = SRC / "pion"
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
CODE = sorted(PKG.rglob("*.py"))
# Benchmarks and scripts: their file paths are checked (their variables may be named
# ``pion``, so dotted names are not).
TOOLS = sorted([*(ROOT / "bench").rglob("*.py"), *(ROOT / "scripts").rglob("*.py")])
# A dotted name under pion; not one followed by ``.0``, ``.<w>`` or ``.{n}``: those are
# the data directory's file names (``pion.vstore.wal.0``), not modules.
_NAME = re.compile(r"(?<![\w./-])pion(?:\.[A-Za-z_]\w*)+(?!\w|\.\d|\.<|\.\{|\.\*|/)")
# Logger names (``logging.getLogger("pion.supervisor")``) are labels, not modules.
_LOGGER = re.compile(r"getLogger\(\s*[\"']([\w.]+)")
# File names of the data directory that read like dotted names.
_FILE_NAMES = re.compile(r"pion\.(vstore|keyspace|ssm|lock)(\.wal)?$")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _module_file(parts: list[str]) -> Path | None:
    base = SRC.joinpath(*parts)
    # A compiled twin (``_speedups``) is named by its C source.
    for candidate in (base.with_suffix(".py"), base / "__init__.py", base.with_suffix(".c")):
        if candidate.is_file():
            return candidate
    if base.is_dir():  # a namespace-like directory (server/ before it had a face)
        return base
    return None


def _top_names(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        names[n.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # try/except ImportError, TYPE_CHECKING
            inner = ast.Module(body=[*node.body, *getattr(node, "orelse", [])], type_ignores=[])
            names.update(_top_names(inner))
    return names


def _class_names(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def resolves(dotted: str) -> bool:
    """``pion.a.b.C.d``: a module (or package), then names defined in it, then one
    level of names in a class it defines."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        found = _module_file(parts[:cut])
        if found is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        if found.is_dir() or found.suffix == ".c":
            return found.suffix == ".c" and len(rest) == 1
        names = _top_names(_tree(found))
        node = names.get(rest[0])
        if node is None:
            return False
        if len(rest) == 1 or not isinstance(node, ast.ClassDef):
            return True  # an attribute of an imported object or a value: not followed
        return rest[1] in _class_names(node)
    return False


def _dotted_names() -> Iterator[tuple[str, str]]:
    for path in [*CODE, *DOCS]:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            loggers = set(_LOGGER.findall(line))
            for m in _NAME.finditer(line):
                name = m.group(0)
                if _FILE_NAMES.match(name) or name in loggers:
                    continue
                yield f"{_rel(path)}:{lineno}", name


def test_every_pion_name_resolves() -> None:
    bad = [f"{where}: {name}" for where, name in _dotted_names() if not resolves(name)]
    assert not bad, "names that do not exist:\n" + "\n".join(bad)


# -- links and paths -------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(
    r"(?<![\w/.-])((?:docs|src|tests|bench|scripts|examples)/[\w./-]*\w\.(?:md|py|c|json|sh|toml|txt))"
)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to
    hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        slug = _slug(line.lstrip("#"))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def _links() -> Iterator[tuple[str, Path, str]]:
    for path in DOCS:
        in_code = False
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                in_code = not in_code
            if in_code:
                continue
            for m in _LINK.finditer(line):
                target = m.group(1)
                if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                    continue
                yield f"{_rel(path)}:{lineno}", path, target


def test_every_relative_link_resolves() -> None:
    bad = []
    for where, path, target in _links():
        file, _, anchor = target.partition("#")
        dest = path if not file else (path.parent / file).resolve()
        if not dest.exists():
            bad.append(f"{where}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{where}: {target} (no heading #{anchor})")
    assert not bad, "links that do not resolve:\n" + "\n".join(bad)


def test_every_file_path_named_in_code_and_docs_exists() -> None:
    bad = []
    for path in [*CODE, *TOOLS, *DOCS]:
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for m in _PATH.finditer(line):
                if not (ROOT / m.group(1)).exists():
                    bad.append(f"{_rel(path)}:{lineno}: {m.group(1)}")
    assert not bad, "paths that do not exist:\n" + "\n".join(bad)


def test_the_source_tour_covers_every_package() -> None:
    """Every package under src/pion, and every command family module (the keyspace's
    included), is named in the README's source tour."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("## Source tour")
    end = readme.find("\n## ", start + 1)
    tour = readme[start : end if end > 0 else None]
    missing = [
        f"{pkg.name}/"
        for pkg in sorted(p for p in PKG.iterdir() if p.is_dir() and p.name != "__pycache__")
        if f"{pkg.name}/" not in tour
    ]
    for module in sorted((PKG / "commands").glob("*.py")):
        if module.name != "__init__.py" and f"`{module.name}`" not in tour:
            missing.append(f"commands/{module.name}")
    assert not missing, "not in the README's source tour: " + ", ".join(missing)


# -- counts the docs state -------------------------------------------------------------

_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
_NUMBERS |= {"eight": 8, "nine": 9, "ten": 10}


def _number(word: str) -> int:
    return int(word) if word.isdigit() else _NUMBERS[word.lower()]


def _phrases(pattern: str, paths: list[Path]) -> Iterator[tuple[str, int]]:
    regex = re.compile(pattern, re.IGNORECASE)
    for path in paths:
        text = " ".join(path.read_text().split())  # phrases may wrap
        for m in regex.finditer(text):
            yield f"{_rel(path)}: {m.group(0)!r}", _number(m.group(1))


def test_counts_in_the_docs_come_from_the_code(tmp_path: Path) -> None:
    import dataclasses

    from pion.codecs.registry import ALL_FORMAT_NAMES, FORMAT_NAMES
    from pion.commands import COMMAND_TABLE
    from pion.commands.generic import KEY_POSITIONS
    from pion.config import ServerConfig
    from pion.server.run import build_state

    state = build_state(dataclasses.replace(ServerConfig(), dir=tmp_path, port=0))
    assert state.persistence is not None
    stores = len(state.persistence.stores)
    state.persistence.close()
    words = "|".join(_NUMBERS)
    checks = [
        # COMMAND COUNT's figure, and the keyspace commands COMMAND gives key positions.
        (r"number of commands \((\d+) in this build\)", DOCS, len(COMMAND_TABLE)),
        (r"redis-server's for the (\d+)\s+commands", DOCS, len(KEY_POSITIONS)),
        # "the N durable stores" (not "two stores' renames": any two of them).
        (rf"\bthe ({words}) (?:durable )?stores\b(?!')", [*DOCS, *CODE], stores),
        (rf"\b({words}|\d+) storage formats", [*DOCS, *CODE], len(ALL_FORMAT_NAMES)),
        (rf"\bone of ({words}|\d+) formats", [*DOCS, *CODE], len(FORMAT_NAMES)),
    ]
    bad, seen = [], 0
    for pattern, paths, want in checks:
        found = list(_phrases(pattern, paths))
        seen += bool(found)
        bad += [f"{where} says {n}, the code has {want}" for where, n in found if n != want]
    assert not bad, "\n".join(bad)
    assert seen == len(checks)  # each count is stated somewhere (so the check ran)
    assert set(KEY_POSITIONS) <= set(COMMAND_TABLE)


def test_the_resolver_can_say_no() -> None:
    """What the name check relies on: a wrong module, a wrong name, a wrong method."""
    assert resolves("pion.persistence.stores.FREEING_COMMANDS")
    assert resolves("pion.client.PionPromptCache")
    assert resolves("pion.persistence.durability.Persistence.write_refusal")
    assert resolves("pion.resp._speedups")
    assert not resolves("pion.commands.budgets")
    assert not resolves("pion.llama.tiers")
    assert not resolves("pion.persistence.stores.NOT_THERE")
    assert not resolves("pion.persistence.durability.Persistence.no_such_method")


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
