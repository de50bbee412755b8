"""Recorded human speech for the benches, from packages this machine may install (never downloaded
at run time by the product): where a clip named in bench/data/*.json lives, and its 16 kHz audio.

A source is ``<origin>:<path>``:

* ``gradio:<path>`` — a file inside the installed gradio package (a dependency, for the demo);
* ``alsa:<name>`` — ALSA's test voice, /usr/share/sounds/alsa (Debian alsa-utils);
* ``debian:<package>/<path>`` — a file of a Debian package, fetched once with ``apt-get download``
  and unpacked with ``dpkg-deb -x`` under ~/.cache/synchrony-bench/debs (the package is named in
  bench/data with its license).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("SYNCHRONY_BENCH_CACHE", Path.home() / ".cache" / "synchrony-bench"))


def source_path(source: str) -> Path | None:
    """The local file of ``source`` (fetching a Debian package once), or None where unavailable."""
    origin, _, name = source.partition(":")
    if origin == "gradio":
        import gradio

        return Path(gradio.__file__).parent / name
    if origin == "alsa":
        return Path("/usr/share/sounds/alsa") / name
    if origin == "debian":
        package, _, inner = name.partition("/")
        root = CACHE / "debs" / package
        if not root.exists() and not _unpack(package, root):
            return None
        return root / inner
    raise ValueError(f"unknown clip source {source!r}")


def _unpack(package: str, root: Path) -> bool:
    """``apt-get download`` + ``dpkg-deb -x`` of ``package`` into ``root``; False on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(["apt-get", "download", package], cwd=tmp, check=True, capture_output=True, timeout=300)
            deb = next(Path(tmp).glob("*.deb"))
            root.mkdir(parents=True, exist_ok=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True, timeout=300)
        except (OSError, subprocess.SubprocessError, StopIteration) as exc:
            print(f"  (cannot fetch Debian package {package}: {exc})")
            return False
    return True


def load(source: str) -> np.ndarray | None:
    """16 kHz mono float32 audio of ``source`` (None where unavailable)."""
    from app.offline.media_io import decode_media

    path = source_path(source)
    if path is None or not path.exists():
        print(f"  (skipping {source}: not available)")
        return None
    return decode_media(path).audio
