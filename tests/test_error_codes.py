"""Every code of the REST API's error enum (rftweb/exceptions.py CODES) is one that product
code can produce: some error class of that code is raised or built somewhere in apps, kernel,
rftweb or workers. A code nothing raises is a promise the schema makes and the server never keeps."""

from __future__ import annotations

import ast
from pathlib import Path


from kernel import exceptions as kinds
from rftweb.exceptions import CODES, CLASS_CODES, MalformedJSON, Unauthenticated, error_code, status_code

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("apps", "kernel", "rftweb", "workers")


def product_trees() -> list[ast.Module]:
    return [ast.parse(p.read_text()) for package in PRODUCT for p in sorted((ROOT / package).rglob("*.py"))
            if "/migrations/" not in p.as_posix()]


def class_codes(trees: list[ast.Module]) -> dict[str, str]:
    """Error class name -> its code, for the kinds and every subclass of them defined in the
    product (a subclass has its first base's code that has one, as error_code finds it)."""
    codes: dict[str, str] = {cls.__name__: code for cls, code in CLASS_CODES.items()}
    classes = [node for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)]
    changed = True
    while changed:  # bases may be defined after their subclasses' modules are read
        changed = False
        for node in classes:
            if node.name in codes:
                continue
            inherited = [codes[b.id] for b in node.bases if isinstance(b, ast.Name) and b.id in codes]
            if inherited:
                codes[node.name] = inherited[0]
                changed = True
    return codes


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


def test_each_code_belongs_to_one_error_class() -> None:
    assert sorted(CLASS_CODES.values()) == sorted(CODES)


def test_an_error_has_its_nearest_kinds_code() -> None:
    assert error_code(kinds.TooLarge("big")) == "too_large"  # before InvalidInput, its base
    assert error_code(kinds.ExportFailed("no")) == "invalid_input"
    assert error_code(Unauthenticated("who")) == "unauthenticated"
    assert error_code(MalformedJSON("{")) == "malformed_json"
    assert error_code(kinds.RftError("plain")) == "bad_request"


def test_a_status_with_no_error_behind_it_gets_its_kinds_code() -> None:
    assert (status_code(404), status_code(429), status_code(405), status_code(504)) == (
        "not_found", "rate_limited", "bad_request", "unavailable")
