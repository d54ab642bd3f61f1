"""The import graph of ``explorer/`` and ``operators/``: no cycle, and imports point down the wings.

Every internal import counts: module-level, function-level (lazy), and the string literals
of ``importlib.import_module("...")``; imports under ``if TYPE_CHECKING:`` do not (they never
run).  ``from package import name`` is an import of ``package.name`` when that is a module,
else of ``package``; a module importing its own parent package is not an edge (Python
imports it first anyway).

Cycles are the graph's strongly connected components of more than one module (or a module
importing itself); each is printed with one cycle through it.  The wings, lowest first::

    operators < explorer.core < explorer.measure < explorer.model < explorer.plan
              < explorer.search < explorer.runner < explorer (cli, exploration: the top)

An import from a lower wing to a higher one is reported, and so is an import of an internal
module or package name that does not exist in this tree (an editable install elsewhere may
otherwise quietly serve an old copy).  Exit 1 on any finding, else 0.

    python scripts/import_cycles.py [ROOT]        (ROOT: the repository, default: this one)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("explorer", "operators")
#: Wings, lowest first: a module belongs to the longest prefix listed.
WINGS = ("operators", "explorer.core", "explorer.measure", "explorer.model", "explorer.plan", "explorer.search",
         "explorer.runner", "explorer")


def modules(root: Path) -> dict[str, Path]:
    """``{dotted name: path}`` of every module under the packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    skip.update(id(n) for n in ast.walk(child))
    return skip


def defined(path: Path) -> set[str]:
    """The names a package's ``__init__.py`` defines: assignments, definitions, imports, and the
    keys of a lazy ``_PUBLIC = {name: module}`` map."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "_PUBLIC" for t in targets) and isinstance(node.value, ast.Dict):
                names.update(k.value for k in node.value.keys if isinstance(k, ast.Constant))
        elif isinstance(node, ast.Try):
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    names.add(n.id)
    return names


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, int, bool]]:
    """``[(imported module, line, lazy)]`` of one module: its internal imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_checking_nodes(tree)
    lazy = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lazy.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def add(target: str, node: ast.AST, names=()):
        if target.split(".")[0] not in PACKAGES:
            return
        wanted = target
        while target not in known and "." in target:  # an attribute of a module, not a module
            target = target.rpartition(".")[0]
        if target != wanted and known.get(target, Path()).name == "__init__.py":
            # a missing module under a package: an editable install may find an old copy elsewhere
            found.append(("?" + wanted, node.lineno, id(node) in lazy))
            return
        for attr in names:  # ``from package import name``: a submodule or a name the package defines
            if known.get(target, Path()).name == "__init__.py" and attr not in defined(known[target]):
                found.append((f"?{target}.{attr}", node.lineno, id(node) in lazy))
        if target in known and target != name and not name.startswith(target + "."):
            found.append((target, node.lineno, id(node) in lazy))

    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                add(sub, node) if sub in known else add(module, node, (alias.name,))
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                    and isinstance(node.args[0].value, str):
                add(node.args[0].value, node)
    return found


def graph(root: Path) -> dict[str, dict[str, list[tuple[int, bool]]]]:
    """``{module: {imported module: [(line, lazy), ...]}}``."""
    known = modules(root)
    out: dict[str, dict[str, list[tuple[int, bool]]]] = {name: {} for name in known}
    for name, path in known.items():
        for target, line, lazy in imports(name, path, known):
            out[name].setdefault(target, []).append((line, lazy))
    return out


def unresolved(edges: dict[str, dict]) -> list[str]:
    """Imports of internal modules or names that do not exist here (``?``-marked by :func:`imports`)."""
    return [f"unresolved: {module}:{sites[0][0]} imports {target[1:]}, which is not in this tree"
            for module, targets in sorted(edges.items()) for target, sites in sorted(targets.items())
            if target.startswith("?")]


def _resolved(edges: dict[str, dict]) -> dict[str, dict]:
    return {m: {t: s for t, s in targets.items() if not t.startswith("?")} for m, targets in edges.items()}


def strongly_connected(edges: dict[str, dict]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(edges.get(child, ()))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    out.append(sorted(component))
    return out


def cycle_through(component: list[str], edges: dict[str, dict]) -> list[str]:
    """One cycle through the component's first module (breadth-first: a shortest one)."""
    members, start = set(component), component[0]
    parent, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for node in frontier:
            for child in edges[node]:
                if child == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]  # the chain of parents ends at start
                if child in members and child not in parent:
                    parent[child] = node
                    nxt.append(child)
        frontier = nxt
    return component


def wing(module: str) -> int:
    """The rank of a module's wing (``WINGS``: the longest prefix)."""
    best, rank = -1, 0
    for i, prefix in enumerate(WINGS):
        if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
            best, rank = len(prefix), i
    return rank


#: Folders whose imports of the packages must resolve too (they are not part of the graph).
USERS = ("tests", "scripts", "harness")


def users_unresolved(root: Path) -> list[str]:
    """Imports of ``explorer``/``operators`` modules or names that do not exist, in ``USERS``."""
    known = modules(root)
    out = []
    for folder in USERS:
        for path in sorted((root / folder).rglob("*.py")) if (root / folder).is_dir() else ():
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            found = {name: {}}
            for target, line, lazy in imports(name, path, known):
                found[name].setdefault(target, []).append((line, lazy))
            out += unresolved(found)
    return out


def check(root: Path) -> list[str]:
    """The findings, one line each: unresolved imports, cycles, then imports up the wings."""
    raw = graph(root)
    edges = _resolved(raw)
    findings = unresolved(raw) + users_unresolved(root)
    for component in strongly_connected(edges):
        if len(component) > 1 or component[0] in edges[component[0]]:
            path = cycle_through(component, edges)
            steps = []
            for a, b in zip(path, path[1:]):
                line, lazy = edges[a][b][0]
                steps.append(f"{a}:{line}{' (lazy)' if lazy else ''} -> {b}")
            findings.append(f"cycle among {', '.join(component)}: " + "; ".join(steps))
    for module, targets in sorted(edges.items()):
        for target, sites in sorted(targets.items()):
            if wing(target) > wing(module):
                line, lazy = sites[0]
                findings.append(f"up the wings: {module}:{line}{' (lazy)' if lazy else ''} imports {target} "
                                f"({WINGS[wing(module)]} < {WINGS[wing(target)]})")
    return findings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent
    edges = _resolved(graph(root))
    n_edges = sum(len(t) for t in edges.values())
    n_lazy = sum(1 for t in edges.values() for sites in t.values() if all(lazy for _, lazy in sites))
    findings = check(root)
    for line in findings:
        print(line)
    print(f"{len(edges)} modules, {n_edges} internal imports ({n_lazy} only inside functions): "
          + (f"{len(findings)} finding(s)" if findings else "no cycle, every import points down the wings"))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
