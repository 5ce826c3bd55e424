"""Every code of the REST API's error enum (rftweb/exceptions.py CODES) is one that product
code can produce: some error class carrying it is raised or built somewhere in apps, rftweb
or workers. A code nothing raises is a promise the schema makes and the server never keeps."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rftweb import exceptions
from rftweb.exceptions import CODES, RftError

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("apps", "kernel", "rftweb", "workers")


def product_trees() -> list[ast.Module]:
    return [ast.parse(p.read_text()) for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))
            if "/migrations/" not in p.as_posix()]


def class_codes(trees: list[ast.Module]) -> dict[str, str]:
    """Error class name -> its code, for every subclass of the kinds defined in the product
    (a class without its own `code` inherits its first base's that has one)."""
    codes = {name: cls.code for name, cls in vars(exceptions).items()
             if isinstance(cls, type) and issubclass(cls, RftError)}
    classes = [node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:  # bases may be defined after their subclasses' modules are read
        changed = False
        for node in classes:
            if node.name in codes:
                continue
            own = [s.value.value for s in node.body if isinstance(s, ast.AnnAssign | ast.Assign)
                   and isinstance(s.value, ast.Constant) and _assigns_code(s)]
            inherited = [codes[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in codes]
            if own or inherited:
                codes[node.name] = (own or inherited)[0]
                changed = True
    return codes


def _assigns_code(statement: ast.AnnAssign | ast.Assign) -> bool:
    targets = [statement.target] if isinstance(statement, ast.AnnAssign) else statement.targets
    return any(isinstance(t, ast.Name) and t.id == "code" for t in targets)


def called_names(trees: list[ast.Module]) -> set[str]:
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


def test_every_code_is_raised_somewhere() -> None:
    trees = product_trees()
    codes = class_codes(trees)
    built = called_names(trees)
    raised = {code for name, code in codes.items() if name in built}
    assert set(CODES) - raised == set()


def test_a_class_with_a_code_outside_the_enum_fails_at_once() -> None:
    with pytest.raises(TypeError, match="not one of"):
        type("Typo", (exceptions.NotFound,), {"code": "not_fonud"})


def test_each_kind_has_its_own_code() -> None:
    kinds = [exceptions.RftError, exceptions.InvalidInput, exceptions.TooLarge, exceptions.NotFound,
             exceptions.NotAllowed, exceptions.Conflict, exceptions.RateLimited, exceptions.Unavailable,
             exceptions.UpstreamFailed, exceptions.Unauthenticated, exceptions.MalformedJSON]
    assert sorted(k.code for k in kinds) == sorted(CODES)
