"""A private network for the serving tests: a network namespace with a non-loopback address, a
self-signed certificate for it, and Debian's coturn inside it.

Browsers treat loopback as a secure context, so serving "another machine" has to be tested at an
address that is not loopback. The test makes its own namespace (iproute2; needs root, as CI runs)
with a veth pair of two private addresses, and moves the calling thread into it for the test
(``inside``): every socket the thread opens, and every process it starts (Chromium, coturn), lives
there, and no packet leaves it. ``skip_reason()`` says why a machine cannot (not root, no iproute2,
namespaces refused).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import ipaddress
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNET = 0x40000000
SERVER_IP = "10.77.0.1"
CLIENT_IP = "10.77.0.2"
TURN_PORT = 3478
TURN_REALM = "synchrony.test"


def skip_reason() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs as root)"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (make system)"
    name = f"sy-probe-{os.getpid()}"
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create a network namespace: {probe.stderr.strip()[:200]}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@dataclass(frozen=True)
class Namespace:
    name: str
    server_ip: str = SERVER_IP
    client_ip: str = CLIENT_IP


@contextlib.contextmanager
def namespace() -> Iterator[Namespace]:
    """A fresh namespace with lo up and a veth pair ``SERVER_IP`` / ``CLIENT_IP`` (/24), removed after."""
    ns = Namespace(f"sy-test-{os.getpid()}")
    subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)
    _ip("netns", "add", ns.name)
    try:
        # No IPv6: a link-local address appearing a second after the links come up is a network change to
        # Chromium, which then aborts the page's in-flight requests (ERR_NETWORK_CHANGED).
        off = "for c in all default; do echo 1 > /proc/sys/net/ipv6/conf/$c/disable_ipv6; done"
        subprocess.run(["ip", "netns", "exec", ns.name, "sh", "-c", off], capture_output=True)  # no procps needed
        _ip("-n", ns.name, "link", "set", "lo", "up")
        _ip("-n", ns.name, "link", "add", "sy-s", "type", "veth", "peer", "name", "sy-c")
        _ip("-n", ns.name, "addr", "add", f"{ns.server_ip}/24", "dev", "sy-s")
        _ip("-n", ns.name, "addr", "add", f"{ns.client_ip}/24", "dev", "sy-c")
        _ip("-n", ns.name, "link", "set", "sy-s", "up")
        _ip("-n", ns.name, "link", "set", "sy-c", "up")
        _settle(ns)
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns.name], capture_output=True)


def _settle(ns: Namespace, timeout_s: float = 10.0) -> None:
    """Wait until both veth ends are up with no tentative address, so no change reaches a browser later."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        links = subprocess.run(["ip", "-n", ns.name, "-o", "link", "show"], capture_output=True, text=True).stdout
        addrs = subprocess.run(["ip", "-n", ns.name, "-o", "addr", "show"], capture_output=True, text=True).stdout
        up = [line for line in links.splitlines() if "sy-" in line and "state UP" in line]
        if len(up) == 2 and "tentative" not in addrs:
            return
        time.sleep(0.05)
    raise RuntimeError(f"namespace {ns.name}: links not up after {timeout_s} s")


@contextlib.contextmanager
def inside(ns: Namespace) -> Iterator[None]:
    """Run the calling thread in ``ns`` (sockets it opens and processes it starts stay there)."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns.name}", os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns into the test namespace failed")
        try:
            yield
        finally:
            if libc.setns(own, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the test's own namespace failed")
    finally:
        os.close(own)
        os.close(target)


def self_signed(directory: Path, address: str) -> tuple[Path, Path]:
    """A self-signed certificate (and key) for ``address``, as PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, address)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def spki_hash(cert_path: Path) -> str:
    """base64 SHA-256 of the certificate's public key (Chromium's --ignore-certificate-errors-spki-list)."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()


class Coturn:
    """Debian's ``turnserver`` on ``address``:3478 with a shared secret (``use-auth-secret``), relaying
    only to addresses of the test's namespace. Start it from inside the namespace."""

    def __init__(self, address: str, secret: str, workdir: Path) -> None:
        self.address, self.secret = address, secret
        self.log = workdir / "turnserver.log"
        net = ipaddress.ip_network(f"{address}/24", strict=False)
        span = f"{net.network_address}-{net.broadcast_address}"
        self.command = [
            shutil.which("turnserver") or "/usr/bin/turnserver", "-n", f"--listening-ip={address}",
            f"--relay-ip={address}", f"--listening-port={TURN_PORT}", "--min-port=49160", "--max-port=49300",
            "--use-auth-secret", f"--static-auth-secret={secret}", f"--realm={TURN_REALM}", "--fingerprint",
            "--no-tls", "--no-dtls", "--no-cli", "--no-multicast-peers",
            "--denied-peer-ip=0.0.0.0-255.255.255.255", f"--allowed-peer-ip={span}",
            f"--pidfile={workdir / 'turnserver.pid'}", f"--log-file={self.log}", "--simple-log", "--verbose",
        ]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"turn:{self.address}:{TURN_PORT}?transport=udp"

    def start(self, timeout_s: float = 10.0) -> None:
        import socket

        self.proc = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # ready when it answers a STUN binding request
            if self.proc.poll() is not None:
                raise RuntimeError(f"turnserver exited with {self.proc.returncode}: {self.log_tail()}")
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.settimeout(0.2)
                s.sendto(bytes.fromhex("000100002112a442") + os.urandom(12), (self.address, TURN_PORT))
                with contextlib.suppress(OSError):
                    s.recvfrom(512)
                    return
        raise RuntimeError(f"turnserver did not answer within {timeout_s} s: {self.log_tail()}")

    def allocations(self) -> int:
        """Relay allocations the log reports created so far."""
        return self.log.read_text(errors="replace").count("ALLOCATE processed, success") if self.log.exists() else 0

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
