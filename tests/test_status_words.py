"""Statuses are written once: no status string literal outside promptsched/domain.py and SQL.

A literal counts as a status where the code treats it as one: compared with (or tested for
membership against) something named ``status``, passed as a ``status``/``*_status`` keyword,
assigned to such a name, or spelled in a ``Literal[...]`` type. The same words used as metric
labels or log fields ("dead", "sent", "lost" outcomes) are not statuses and are left alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from promptsched import domain

PACKAGE = Path(__file__).resolve().parent.parent / "promptsched"
STATUS_WORDS = {
    member.value
    for enum in (domain.RunStatus, domain.AttemptStatus, domain.OutboxStatus)
    for member in enum
}


def _names_status(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return "status" in node.id
    if isinstance(node, ast.Attribute):
        return "status" in node.attr
    if isinstance(node, ast.Subscript):
        key = node.slice
        return isinstance(key, ast.Constant) and "status" in str(key.value)
    return False


def _words(node: ast.AST) -> list[ast.Constant]:
    """Status-word constants in ``node``, alone or inside a tuple, list or set."""
    items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
    return [
        item
        for item in items
        if isinstance(item, ast.Constant)
        and isinstance(item.value, str)
        and item.value in STATUS_WORDS
    ]


def _status_literals(tree: ast.AST) -> list[ast.Constant]:
    found: list[ast.Constant] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_names_status(side) for side in sides):
                found += [word for side in sides for word in _words(side)]
        elif isinstance(node, ast.keyword) and node.arg and "status" in node.arg:
            found += _words(node.value)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is not None and any(_names_status(t) for t in targets):
                found += _words(node.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "Literal"
        ):
            found += _words(node.slice)
    return found


def _hits(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(PACKAGE.parent)
    return [f"{where}:{word.lineno}: {word.value!r}" for word in _status_literals(tree)]


def test_no_status_literal_outside_the_domain_module() -> None:
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "domain.py"
        for hit in _hits(path)
    ]
    assert found == []


def test_the_check_sees_status_literals() -> None:
    """Each form the check looks for is found, and a label of the same word is not."""
    source = """
run.status == "dead"
row["status"] in ("pending", "running")
finish(status="succeeded")
next_status = "cancelled"
kind: Literal["pending", "skipped"]
metrics.deliveries.labels(channel, "dead").inc()
"""
    words = sorted(word.value for word in _status_literals(ast.parse(source)))
    assert words == ["cancelled", "dead", "pending", "pending", "running", "skipped", "succeeded"]
