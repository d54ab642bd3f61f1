"""The house's size rules, checked: no module over 600 lines, no function over 80 lines, no public
function over 8 parameters, unless ``docs/architecture.md`` names it with its reason; and the
module tables of ``docs/architecture.md`` state every module's lines as they are.

    python scripts/code_size.py [ROOT]

Reads every ``.py`` file under ``explorer/`` and ``operators/`` (``ast``, nothing imported).  A
function's lines run from its ``def`` to its last line, docstring included; its parameters are
every name it takes but ``self``/``cls``; it is public when neither it nor its class starts with
``_``.  The exceptions are the rows of the table under "Known exceptions" in
``docs/architecture.md`` whose first cell is a backticked path followed by a backticked name
(``| `explorer/cli.py` `_cmd_run` | 86 lines | why |``) and whose second is the size as this
script states it.  Prints each finding and exits 1 when a rule is broken by something the table
does not name, or a row names something that no longer breaks one or states another size (a
stale row); exits 0 otherwise.  The module tables are the rows before "Known exceptions" whose
first cell is a backticked path and second a line count (``| `explorer/cli.py` | 597 | concept |``):
every module but a package's ``__init__.py`` has one, with its line count.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_PUBLIC_PARAMETERS = 8
PACKAGES = ("explorer", "operators")


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return len([n for n in names if n not in ("self", "cls")])


def findings(root: Path) -> dict[tuple[str, str], str]:
    """``{(path, name): what breaks a rule}`` for every function, and ``(path, "")`` per module."""
    found: dict[tuple[str, str], str] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            source = path.read_text()
            n_lines = len(source.splitlines())
            if n_lines > MAX_MODULE_LINES:
                found[(rel, "")] = f"{n_lines} lines"
            tree = ast.parse(source)
            _visit(tree, rel, public_scope=True, found=found)
    return found


def _visit(node, rel: str, public_scope: bool, found: dict) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            _visit(child, rel, public_scope and not child.name.startswith("_"), found)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            problems = []
            lines = child.end_lineno - child.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                problems.append(f"{lines} lines")
            params = _parameters(child)
            if public_scope and not child.name.startswith("_") and params > MAX_PUBLIC_PARAMETERS:
                problems.append(f"{params} parameters")
            if problems:
                found[(rel, child.name)] = ", ".join(problems)
            _visit(child, rel, False, found)  # nested functions: their lines count, their names are private


def named_exceptions(architecture: str) -> dict[tuple[str, str], str]:
    """``{(path, name): size}``: the rows of the "Known exceptions" table (``(path, "")`` for a
    module), each with its second cell (``"144 lines, 18 parameters"``)."""
    start = architecture.find("## Known exceptions")
    if start < 0:
        return {}
    named = {}
    for line in architecture[start:].splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.split("|")[1:]]
        ticks = re.findall(r"`([^`]+)`", cells[0])
        if not ticks or not ticks[0].endswith(".py"):
            continue
        path, names = ticks[0], ticks[1:] or [""]
        named.update({(path, name): cells[1] if len(cells) > 1 else "" for name in names})
    return named


def module_rows(architecture: str) -> dict[str, int]:
    """``{path: lines}``: the module tables' rows (before "Known exceptions")."""
    end = architecture.find("## Known exceptions")
    rows = re.findall(r"^\| `([\w/.]+\.py)` \| (\d+) \|", architecture[:end if end >= 0 else None], re.M)
    return {path: int(lines) for path, lines in rows}


def module_table_findings(root: Path, rows: dict[str, int]) -> list[str]:
    """A line per module whose table row is missing, names no module, or states other lines."""
    out = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            lines = len(path.read_text().splitlines())
            if rel not in rows and path.name != "__init__.py":
                out.append(f"no module row: {rel} ({lines} lines)")
            elif rel in rows and rows[rel] != lines:
                out.append(f"stale module row: {rel}: the table says {rows[rel]} lines, it is {lines}")
    out += [f"module row names no module: {rel}" for rel in sorted(rows) if not (root / rel).is_file()]
    return out


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    found = findings(root)
    named = named_exceptions((root / "docs" / "architecture.md").read_text())
    unnamed = {k: v for k, v in found.items() if k not in named}
    stale = sorted(k for k in named if k not in found)
    misstated = {k: (named[k], v) for k, v in found.items() if k in named and named[k] != v}
    for (path, name), what in sorted(unnamed.items()):
        print(f"unnamed: {path} {name or '(module)'}: {what}")
    for path, name in stale:
        print(f"stale row: {path} {name or '(module)'} no longer breaks a rule")
    for (path, name), (said, what) in sorted(misstated.items()):
        print(f"stale size: {path} {name or '(module)'}: the row says {said!r}, it is {what!r}")
    table = module_table_findings(root, module_rows((root / "docs" / "architecture.md").read_text()))
    for line in table:
        print(line)
    bad = unnamed or stale or misstated or table
    print(f"{len(found)} over a rule, {len(found) - len(unnamed)} of them named in docs/architecture.md"
          f"{'' if bad else ': ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
