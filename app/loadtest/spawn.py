"""The server under test: loopback-only targets, ``synchrony serve`` spawned on a free port, its counters.

Only loopback targets are accepted: this tool generates load, and must not be pointed elsewhere.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from alignment.json_types import JsonObject


def check_loopback_url(url: str) -> str:
    """The WHIP endpoint URL if its host is loopback; ValueError otherwise (this tool makes load)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 80, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise ValueError(f"cannot resolve {parts.hostname!r}: {exc}") from exc
    addrs = {info[4][0] for info in infos}
    if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
        raise ValueError(f"refusing non-loopback target {parts.hostname!r} ({', '.join(sorted(addrs))}): "
                         "load tests only run against this machine")
    path = parts.path if parts.path.rstrip("/").endswith("whip") else parts.path.rstrip("/") + "/whip"
    return f"{parts.scheme}://{parts.netloc}{path}"


def base_url(whip_url: str) -> str:
    """The server's root (scheme://host:port): where ``/readyz`` and ``/metrics`` live beside ``/whip``."""
    parts = urlsplit(whip_url)
    return f"{parts.scheme}://{parts.netloc}"


class SpawnedServer:
    """``synchrony serve`` in a subprocess on 127.0.0.1 and a free port, logging to a file."""

    def __init__(self, max_sessions: int, log_path: Path, extra: list[str] | None = None,
                 code_dir: Path | None = None, cores: set[int] | None = None) -> None:
        """``code_dir``: run the server from that source tree (a benchmark's baseline), not this one;
        ``cores``: run it (and what it starts) on these cores only."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/whip"
        self.log_path = log_path
        cmd = [sys.executable, "-c", "import sys; from app.cli import main; sys.exit(main())", "serve",
               "--host", "127.0.0.1", "--port", str(self.port), "--max-sessions", str(max_sessions),
               *(extra or [])]
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        env = None if code_dir is None else {**os.environ, "PYTHONPATH": str(code_dir)}
        if cores:
            cmd = ["taskset", "-c", ",".join(map(str, sorted(cores))), *cmd]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     cwd=None if code_dir is None else str(code_dir))

    def wait_ready(self, timeout_s: float = 180.0) -> JsonObject:
        import httpx

        deadline = time.monotonic() + timeout_s
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; log: {self.log_path}")
            try:
                r = httpx.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2.0)
                if r.status_code == 200:
                    return r.json()
                last = r.text[:200]
            except httpx.HTTPError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise TimeoutError(f"server not ready within {timeout_s:.0f} s ({last}); log: {self.log_path}")

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it has ended (negative: killed by a signal)."""
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()


def scrape_metrics(whip_url: str, max_lines: int = 400) -> dict[str, float]:
    """The server's counters after a round (``GET /metrics``: drops, stage errors, Level-3 checks ...).

    Histogram buckets are left out; a server without the endpoint gives ``{}``.
    """
    import httpx

    try:
        text = httpx.get(base_url(whip_url) + "/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if (line.startswith("#") or "_bucket{" in line or "_created" in line or " " not in line
                or len(out) >= max_lines):
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


def scrape_lst(whip_url: str) -> JsonObject | None:
    """The server's pooled LST figures (``GET /metrics/lst``), None if it has none."""
    import httpx

    try:
        r = httpx.get(base_url(whip_url) + "/metrics/lst", timeout=5.0)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def local_server_pid(url: str) -> int | None:
    """The pid listening on the URL's port on this machine, if psutil may see it."""
    import psutil

    port = urlsplit(url).port or 80
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                return int(c.pid)
    except (psutil.Error, PermissionError):
        return None
    return None
