"""The code stays walkable: no source file over 600 lines, no function over 80 and no docstring over 15 in the
product packages (tests and bench aside), BENCHMARKS.md read at a glance (no line over 200 characters), and every
bench still imports what it names. The import contracts are checked by `lint-imports` in `make test`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "models", "alignment")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_no_source_file_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in _sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_80_lines():
    long = {}
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_docstring_is_over_15_lines():
    """A docstring says why; figures and history live in BENCHMARKS.md and its history file. bench/structure.py
    prints the same count; this keeps it at zero in CI."""
    from bench.structure import long_docstrings

    long = long_docstrings([(p, ast.parse(p.read_text())) for p in _sources()])
    assert not long, f"docstrings over 15 lines: {long}"


def test_benchmarks_md_has_no_line_over_200_characters():
    from bench.structure import long_lines

    lines = long_lines(ROOT / "BENCHMARKS.md")
    assert not lines, f"BENCHMARKS.md lines over 200 characters: {lines}"


def test_the_sources_are_found():
    assert len(_sources()) > 50  # the check above looked at the packages, not at an empty glob


def test_every_project_import_in_the_benches_resolves():
    """A bench imports lazily, inside its functions, so a name moved in the product breaks it only when run
    (bench/answer_cpu.py kept importing two helpers from app.live.answer after they moved to warm_answer)."""
    import importlib
    import importlib.util

    missing = []
    for p in sorted((ROOT / "bench").glob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] in (*PACKAGES, "bench")):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    missing.append(f"{p.name}:{node.lineno} {node.module}.{alias.name}")
    assert not missing, f"bench imports that no longer resolve: {missing}"
