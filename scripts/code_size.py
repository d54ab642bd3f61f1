"""The house's size rules, checked: no module over 600 lines, no function over 80 lines, no public
function over 8 parameters, unless ``docs/architecture.md`` names it with its reason.

    python scripts/code_size.py [ROOT]

Reads every ``.py`` file under ``explorer/`` and ``operators/`` (``ast``, nothing imported).  A
function's lines run from its ``def`` to its last line, docstring included; its parameters are
every name it takes but ``self``/``cls``; it is public when neither it nor its class starts with
``_``.  The exceptions are the rows of the table under "Known exceptions" in
``docs/architecture.md`` whose first cell is a backticked path followed by backticked names
(``| `explorer/cli.py` `_cmd_explore`, `_cmd_run` | ...``).  Prints each finding and exits 1
when a rule is broken by something the table does not name, or the table names something that
no longer breaks one (a stale row); exits 0 otherwise.
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


def named_exceptions(architecture: str) -> set[tuple[str, str]]:
    """The ``(path, name)`` pairs the "Known exceptions" table names (``(path, "")`` for a module)."""
    start = architecture.find("## Known exceptions")
    if start < 0:
        return set()
    named = set()
    for line in architecture[start:].splitlines():
        if not line.startswith("| `"):
            continue
        first = line.split("|")[1]
        ticks = re.findall(r"`([^`]+)`", first)
        if not ticks or not ticks[0].endswith(".py"):
            continue
        path, names = ticks[0], ticks[1:]
        named.update((path, name) for name in names) if names else named.add((path, ""))
    return named


def main() -> int:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    found = findings(root)
    named = named_exceptions((root / "docs" / "architecture.md").read_text())
    unnamed = {k: v for k, v in found.items() if k not in named}
    stale = sorted(k for k in named if k not in found)
    for (path, name), what in sorted(unnamed.items()):
        print(f"unnamed: {path} {name or '(module)'}: {what}")
    for path, name in stale:
        print(f"stale row: {path} {name or '(module)'} no longer breaks a rule")
    print(f"{len(found)} over a rule, {len(found) - len(unnamed)} of them named in docs/architecture.md"
          f"{'' if unnamed or stale else ': ok'}")
    return 1 if unnamed or stale else 0


if __name__ == "__main__":
    sys.exit(main())
