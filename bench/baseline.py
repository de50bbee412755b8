"""A benchmark's baseline: another commit's source tree, so two commits can be measured in one run."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def baseline_tree(ref: str, into: Path) -> Path:
    """The source tree of this repository's git ``ref`` (``git archive``), unpacked under ``into``: the
    ``code_dir`` of a benchmark's baseline server (``app.loadtest.spawn.SpawnedServer``)."""
    tree = into / f"baseline-{ref}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree
