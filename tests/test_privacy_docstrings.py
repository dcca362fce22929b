"""Every function that adds DP noise or spends budget states its privacy terms in its docstring.

The rule (developers' guide): epsilon, sensitivity, neighbouring relation and who knows the
noise. A function is in scope when its body (docstring excluded) draws DP noise
(`discrete_laplace(`, `computation_noise(`, `discrete_laplace_share(`, `tolerant_share(`) or spends or books budget (`.charge(`,
`charge_direct(`, `_insert_charge(`, `charge_direct_queries(`), or when it is itself a
`charge` / `charge_direct` method. Its docstring must name the four terms with the words
this test searches for, so a new noise draw or a new charge path without them fails here.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("he_partition", "parties")

NOISE_OR_SPEND = re.compile(
    r"\bdiscrete_laplace\(|\.computation_noise\(|\.charge\(|\bcharge_direct\(|\b_insert_charge\("
    r"|\bcharge_direct_queries\(|\bdiscrete_laplace_share\(|\btolerant_share\("
)
SPEND_NAMES = {"charge", "charge_direct"}
TERMS = {
    "epsilon": re.compile(r"epsilon", re.I),
    "sensitivity": re.compile(r"sensitivit", re.I),
    "neighbouring relation": re.compile(r"neighbour", re.I),
    "who knows the noise": re.compile(r"\bknows?\b", re.I),
}


def _segment(lines: list[bytes], node: ast.stmt) -> str:
    """`ast.get_source_segment(src, node)` from the file's lines split once (that function splits the whole
    source at every call, which made this scan quadratic in the file size)."""
    if node.end_lineno is None or node.end_col_offset is None:
        return ""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset:node.end_col_offset].decode("utf-8")
    parts = [lines[first][node.col_offset:], *lines[first + 1:last], lines[last][:node.end_col_offset]]
    return b"".join(parts).decode("utf-8")


def _body_without_docstring(lines: list[bytes], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return "\n".join(_segment(lines, stmt) for stmt in body)


@functools.lru_cache(maxsize=1)
def in_scope_functions() -> list[tuple[str, str, str]]:
    """(location, name, docstring) of every function the rule covers."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "_pb2" in path.name:
                continue
            src = path.read_text(encoding="utf-8")
            lines = src.encode("utf-8").splitlines(keepends=True)
            for node in ast.walk(ast.parse(src)):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if node.name in SPEND_NAMES or NOISE_OR_SPEND.search(_body_without_docstring(lines, node)):
                    loc = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found.append((loc, node.name, ast.get_docstring(node) or ""))
    return found


def test_the_scan_finds_the_known_noise_and_budget_paths() -> None:
    # Guards the scan itself: if these drop out, the search patterns above have rotted.
    names = {name for _, name, _ in in_scope_functions()}
    assert {"computation_noise", "decrypt_measurement", "noised_values", "decrypt_values", "dummy_count",
            "charge", "charge_direct", "charge_direct_queries", "identity_estimate"} <= names


@pytest.mark.parametrize("loc,name,doc", [pytest.param(*f, id=f"{f[0]} {f[1]}") for f in in_scope_functions()])
def test_noise_and_budget_functions_state_their_privacy_terms(loc: str, name: str, doc: str) -> None:
    missing = [term for term, pattern in TERMS.items() if not pattern.search(doc)]
    assert not missing, f"{loc} {name}: the docstring does not state {', '.join(missing)}"
