"""Measure how readable the product code's rooms are (issue #48 item 4).

The figures over the product packages (apps, kernel, rftweb, workers; migrations left out):

- functions longer than 80 lines (from `def` to the last line of the body);
- function-local imports of the project's own modules (an `import` inside a function body
  that names apps, kernel, rftweb or workers, or a relative module), in three kinds:
  * heavy: the import defers a heavy library (torch, transformers, trl, vllm, peft, datasets,
    accelerate): what it loads (the module and its packages) imports one at module level,
    directly or through other project modules' module-level imports, and the importer does not
    (a local import in a module that already loads torch defers nothing);
  * documented cycle: the import statement or a comment line just above it carries
    `# cycle: <module> ...`, and <module> is a project module that imports the importer at
    module level (transitively);
  * unexplained: every other one;
- private names imported across modules (`from a.b import _name` where a.b is a project
  module other than the importer).

`python scripts/rooms.py` prints the counts; `--list` prints every finding under
them (of the local imports, the unexplained ones); `--exclude apps/feedback --exclude
workers/algorithms` leaves folders out. The exit status is 0: this is a measuring tape,
tests/test_rooms.py holds the limits.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apps", "kernel", "rftweb", "workers")
MAX_LINES = 80
HEAVY = frozenset({"torch", "transformers", "trl", "vllm", "peft", "datasets", "accelerate"})
LOCAL_KINDS = ("local-heavy", "local-cycle", "local-import")  # "local-import": unexplained
CYCLE_MARK = re.compile(r"#\s*cycle:\s*([A-Za-z_][\w.]*)")


@dataclass(frozen=True)
class Finding:
    kind: str  # "long", one of LOCAL_KINDS, "private-import"
    path: str
    line: int
    what: str


def product_files(root: Path = ROOT, exclude: tuple[str, ...] = ()) -> Iterator[Path]:
    """Every product module under the packages, migrations and excluded folders left out."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if "/migrations/" in relative or any(relative.startswith(e.rstrip("/") + "/") for e in exclude):
                continue
            yield path


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def resolved(node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    """The absolute module an ImportFrom names (relative imports resolved against the importer)."""
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def is_project(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def long_functions(tree: ast.Module, path: str) -> Iterator[Finding]:
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_LINES:
                yield Finding("long", path, node.lineno, f"{node.name} ({length} lines)")


def imports_in_functions(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            for statement in function.body:
                for node in ast.walk(statement):
                    if isinstance(node, ast.Import | ast.ImportFrom):
                        yield node


def imported_modules(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    return [resolved(node, importer, is_package)]


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: outside functions and `if TYPE_CHECKING:`."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def with_packages(module: str) -> list[str]:
    """A module and the packages above it: what `import module` runs."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass(frozen=True)
class Source:
    tree: ast.Module
    lines: list[str]
    is_package: bool


class Graph:
    """The project's module-level import graph, and which modules load a heavy library."""

    def __init__(self, root: Path = ROOT) -> None:
        self.sources: dict[str, Source] = {}
        for package in PACKAGES:
            for path in sorted((root / package).rglob("*.py")):
                text = path.read_text()
                self.sources[module_name(path, root)] = Source(
                    ast.parse(text, filename=str(path)), text.splitlines(), path.name == "__init__.py")
        self.edges: dict[str, set[str]] = {}
        heavy: set[str] = set()
        for name, source in self.sources.items():
            loaded = {m for node in runtime_imports(source.tree) for m in self.loads(node, name)}
            if any(m.split(".")[0] in HEAVY for m in loaded):
                heavy.add(name)
            self.edges[name] = {m for m in loaded if m in self.sources and m != name}
        grown = True
        while grown:  # heavy through other project modules' module-level imports
            grown = False
            for name, targets in self.edges.items():
                if name not in heavy and targets & heavy:
                    heavy.add(name)
                    grown = True
        self.heavy = heavy

    def loads(self, node: ast.Import | ast.ImportFrom, importer: str) -> set[str]:
        """Every module (project or not) that running the import statement loads."""
        if isinstance(node, ast.Import):
            return {m for alias in node.names for m in with_packages(alias.name)}
        module = resolved(node, importer, self.sources[importer].is_package)
        subs = {f"{module}.{alias.name}" for alias in node.names} & self.sources.keys()
        return {*with_packages(module), *subs}

    def is_heavy(self, modules: set[str]) -> bool:
        return any(m in self.heavy for m in modules)

    def reaches(self, start: str, goal: str) -> bool:
        """Whether importing start runs goal's module-level code (module-level imports only)."""
        seen, stack = {start}, [start]
        while stack:
            for target in self.edges.get(stack.pop(), set()):
                if target == goal:
                    return True
                if target not in seen:
                    seen.add(target)
                    stack.append(target)
        return False

    def kind(self, node: ast.Import | ast.ImportFrom, module: str, importer: str) -> str:
        """local-heavy, local-cycle or local-import (unexplained) for a function-local import."""
        loaded = {*with_packages(module), *(self.loads(node, importer) if isinstance(node, ast.ImportFrom) else ())}
        if self.is_heavy(loaded & self.sources.keys()) and not self.is_heavy(set(with_packages(importer))):
            return "local-heavy"
        lines = self.sources[importer].lines
        above = lines[node.lineno - 2] if node.lineno > 1 and lines[node.lineno - 2].lstrip().startswith("#") else ""
        for text in [above, *lines[node.lineno - 1: node.end_lineno or node.lineno]]:
            mark = CYCLE_MARK.search(text)
            if mark and mark.group(1) in self.sources and self.reaches(mark.group(1), importer):
                return "local-cycle"
        return "local-import"


def local_imports(tree: ast.Module, path: str, importer: str, is_package: bool,
                  graph: Graph) -> Iterator[Finding]:
    seen: set[int] = set()  # a nested function's import is found from each enclosing one
    for node in imports_in_functions(tree):
        if id(node) in seen:
            continue
        seen.add(id(node))
        for module in imported_modules(node, importer, is_package):
            if is_project(module):
                yield Finding(graph.kind(node, module, importer), path, node.lineno, module)


def private_imports(tree: ast.Module, path: str, importer: str, is_package: bool) -> Iterator[Finding]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = resolved(node, importer, is_package)
        if not is_project(module) or module == importer:
            continue
        for alias in node.names:
            if alias.name.startswith("_") and not alias.name.startswith("__"):
                yield Finding("private-import", path, node.lineno, f"{module}.{alias.name}")


def findings(root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[Finding]:
    found: list[Finding] = []
    graph = Graph(root)
    for path in product_files(root, exclude):
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(root).as_posix()
        importer = module_name(path, root)
        is_package = path.name == "__init__.py"
        found += long_functions(tree, relative)
        found += local_imports(tree, relative, importer, is_package, graph)
        found += private_imports(tree, relative, importer, is_package)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every finding")
    parser.add_argument("--exclude", action="append", default=[], help="a folder to leave out (repeatable)")
    args = parser.parse_args()
    found = findings(exclude=tuple(args.exclude))
    for kind, label in (("long", f"functions over {MAX_LINES} lines"),
                        ("local-heavy", "function-local project imports deferring a heavy library"),
                        ("local-cycle", "function-local project imports behind a documented cycle"),
                        ("local-import", "function-local project imports unexplained"),
                        ("private-import", "private names imported across modules")):
        mine = [f for f in found if f.kind == kind]
        print(f"{label}: {len(mine)}")
        if args.list and kind not in ("local-heavy", "local-cycle"):
            for f in mine:
                print(f"  {f.path}:{f.line}  {f.what}")

if __name__ == "__main__":
    main()
