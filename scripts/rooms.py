"""Measure how readable the product code's rooms are (issue #48 item 4).

Three figures over the product packages (apps, kernel, rftweb, workers; migrations left out):

- functions longer than 80 lines (from `def` to the last line of the body);
- function-local imports of the project's own modules (an `import` inside a function body
  that names apps, kernel, rftweb or workers, or a relative module);
- private names imported across modules (`from a.b import _name` where a.b is a project
  module other than the importer).

`python scripts/rooms.py` prints the three counts; `--list` prints every finding under
them; `--exclude apps/feedback --exclude workers/algorithms` leaves folders out. The
exit status is 0: this is a measuring tape, tests/test_rooms.py holds the limits.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("apps", "kernel", "rftweb", "workers")
MAX_LINES = 80


@dataclass(frozen=True)
class Finding:
    kind: str  # "long", "local-import", "private-import"
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


def local_imports(tree: ast.Module, path: str, importer: str, is_package: bool) -> Iterator[Finding]:
    seen: set[int] = set()  # a nested function's import is found from each enclosing one
    for node in imports_in_functions(tree):
        if id(node) in seen:
            continue
        seen.add(id(node))
        for module in imported_modules(node, importer, is_package):
            if is_project(module):
                yield Finding("local-import", path, node.lineno, module)


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
    for path in product_files(root, exclude):
        tree = ast.parse(path.read_text(), filename=str(path))
        relative = path.relative_to(root).as_posix()
        importer = module_name(path, root)
        is_package = path.name == "__init__.py"
        found += long_functions(tree, relative)
        found += local_imports(tree, relative, importer, is_package)
        found += private_imports(tree, relative, importer, is_package)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every finding")
    parser.add_argument("--exclude", action="append", default=[], help="a folder to leave out (repeatable)")
    args = parser.parse_args()
    found = findings(exclude=tuple(args.exclude))
    for kind, label in (("long", f"functions over {MAX_LINES} lines"),
                        ("local-import", "function-local project imports"),
                        ("private-import", "private names imported across modules")):
        mine = [f for f in found if f.kind == kind]
        print(f"{label}: {len(mine)}")
        if args.list:
            for f in mine:
                print(f"  {f.path}:{f.line}  {f.what}")


if __name__ == "__main__":
    main()
