"""Every code of the REST API's error enum (rftweb/exceptions.py CODES) is one that product
code can produce: its class (for an error class's code, some error of that class) is raised or
built somewhere in apps, kernel, rftweb or workers. A code nothing raises is a promise the
schema makes and the server never keeps."""

from __future__ import annotations

import ast
from pathlib import Path


from kernel import exceptions as kinds
from rftweb.exceptions import (
    CODES,
    ERROR_CLASS_CODES,
    CLASS_CODES,
    MalformedJSON,
    Unauthenticated,
    error_code,
    error_class_code,
    status_code,
)
from rftweb.uploads import UploadTooLarge

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("apps", "kernel", "rftweb", "workers")


def product_trees() -> list[ast.Module]:
    return [ast.parse(p.read_text()) for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))
            if "/migrations/" not in p.as_posix()]


def class_codes(trees: list[ast.Module]) -> dict[str, str]:
    """Error class name -> its own code (`code = "…"` in its body), for every class that sets one."""
    codes: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for statement in node.body:
                    target = statement.target if isinstance(statement, ast.AnnAssign) else (
                        statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 else None)
                    value = statement.value if isinstance(statement, (ast.Assign, ast.AnnAssign)) else None
                    if (isinstance(target, ast.Name) and target.id == "code" and isinstance(value, ast.Constant)
                            and isinstance(value.value, str)):
                        codes[node.name] = value.value
    return codes


def class_kinds(trees: list[ast.Module]) -> dict[str, str]:
    """Error class name -> its error class's code (its first base's that has one, as error_class_code finds it)."""
    kinds_of: dict[str, str] = {cls.__name__: code for cls, code in CLASS_CODES.items()}
    classes = [node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:  # bases may be defined after their subclasses' modules are read
        changed = False
        for node in classes:
            if node.name in kinds_of:
                continue
            inherited = [kinds_of[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in kinds_of]
            if inherited:
                kinds_of[node.name] = inherited[0]
                changed = True
    return kinds_of


def called_names(trees: list[ast.Module]) -> set[str]:
    names: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                names.add(func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else "")
    return names


def test_every_code_is_raised_somewhere() -> None:
    """A class's own code, where the class itself is built; an error class's, where any error of it is."""
    trees = product_trees()
    codes, kinds_of = class_codes(trees), class_kinds(trees)
    built = called_names(trees)
    raised = {code for name, code in codes.items() if name in built}
    raised_kinds = {kind for name, kind in kinds_of.items() if name in built}
    assert set(CODES) - set(ERROR_CLASS_CODES) - raised == set()
    assert set(ERROR_CLASS_CODES) - raised_kinds == set()


def test_each_error_class_code_belongs_to_one_error_class() -> None:
    assert sorted(CLASS_CODES.values()) == sorted(ERROR_CLASS_CODES)
    assert all(cls.code == code for cls, code in CLASS_CODES.items())


def test_an_error_has_its_own_code_and_its_nearest_kinds() -> None:
    assert (error_code(kinds.TooLarge("big")), error_class_code(kinds.TooLarge("big"))) == ("too_large", "too_large")
    assert (error_code(kinds.ExportFailed("no")), error_class_code(kinds.ExportFailed("no"))) == ("export_failed", "invalid_input")
    assert error_class_code(UploadTooLarge("big")) == "too_large"  # before InvalidInput, its error class's base
    assert error_class_code(Unauthenticated("who")) == "unauthenticated"
    assert error_class_code(MalformedJSON("{")) == "malformed_json"
    assert (error_code(kinds.RftError("plain")), error_class_code(kinds.RftError("plain"))) == ("bad_request", "bad_request")


def test_a_status_with_no_error_behind_it_gets_its_kinds_code() -> None:
    assert (status_code(404), status_code(429), status_code(405), status_code(504)) == (
        "not_found", "rate_limited", "bad_request", "unavailable")
