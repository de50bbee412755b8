"""Issue 34's legibility figures, measured on the tree as it is: print each beside its bound, exit 1 if one fails.

* ``StreamingConfig`` fields (the product's ASR knobs; benches vary the rest with ``dataclasses.replace``);
* ``Any`` as an AST name in app/, models/ and alignment/ (typed records between stages, ``Any`` only at JSON
  boundaries);
* docstrings over 15 source lines (a docstring says why; figures live in BENCHMARKS.md and the history);
* BENCHMARKS.md lines over 200 characters (a page read at a glance).

Usage: ``.venv/bin/python bench/structure.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "models", "alignment")
BOUNDS = {"streaming_config_fields": 12, "any_names": 40, "docstrings_over_15_lines": 0, "benchmarks_long_lines": 0}


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text())) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]


def any_names(trees: list[tuple[Path, ast.Module]]) -> int:
    return sum(isinstance(n, ast.Name) and n.id == "Any" for _, t in trees for n in ast.walk(t))


def long_docstrings(trees: list[tuple[Path, ast.Module]], limit: int = 15) -> list[str]:
    """Docstrings longer than ``limit`` lines as written in the source (quotes included)."""
    out = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                n = (body[0].end_lineno or body[0].lineno) - body[0].lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(ROOT)}:{body[0].lineno} {getattr(node, 'name', '<module>')} ({n})")
    return out


def long_lines(path: Path, limit: int = 200) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines(), 1) if len(line) > limit]


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from models.asr.streaming import StreamingConfig

    trees = _trees()
    docs = long_docstrings(trees)
    lines = long_lines(ROOT / "BENCHMARKS.md")
    figures = {"streaming_config_fields": len(dataclasses.fields(StreamingConfig)), "any_names": any_names(trees),
               "docstrings_over_15_lines": len(docs), "benchmarks_long_lines": len(lines)}
    failed = False
    for name, value in figures.items():
        ok = value <= BOUNDS[name]
        failed |= not ok
        print(f"{name:28s} {value:5d}  (<= {BOUNDS[name]})  {'PASS' if ok else 'FAIL'}")
    for d in docs:
        print("  long docstring:", d)
    if lines:
        print("  BENCHMARKS.md long lines:", ", ".join(map(str, lines)))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
