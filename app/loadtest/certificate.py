"""LST certification reports anyone can check: raw samples as Merkle leaves, an Ed25519-signed root.

A report (``synchrony certify``) keeps every raw sample the server measured. Each sample is a leaf:
``sha256(0x00 ‖ canonical JSON)``; inner nodes are ``sha256(0x01 ‖ left ‖ right)`` over the RFC 6962
split (the left subtree holds the largest power of two below n), so one leaf cannot pose as a node.
The operator's Ed25519 key signs the canonical JSON of ``format`` + ``header`` + ``merkle_root`` +
``verdict``. ``verify`` recomputes every leaf, the root and the verdict from the samples, and checks
the signature with the public key the verifier trusts, so changing any one sample, the verdict, the
header or the signature fails with a message that says which.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from alignment.lst import LST_VERSION, judge_samples, percentile

FORMAT = "synchrony-lst-certificate/1"
#: A JSON object as a report holds it (the report is JSON on disk: its parts stay JSON objects).
JSONObject: TypeAlias = dict[str, object]


@dataclass(frozen=True)
class JudgedSample:
    """What the verdict reads of one sample (the sample itself stays JSON: its leaf hashes that)."""

    kind: str  # ttft, itl, server_itl, seq
    responder: str
    scenario: str
    session: str
    context: str | None
    ms: float | None
    turn_ms: float | None
    kept: bool

    @classmethod
    def of(cls, sample: Mapping[str, object]) -> JudgedSample:
        """Read a sample; ValueError (saying what) when it is not one."""
        if not isinstance(sample, Mapping):
            raise ValueError("not a JSON object")

        def number(key: str) -> float | None:
            v = sample.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{key} is {v!r}, not a number")
            return v  # as written: an int stays an int, so a verdict's maxima read back byte for byte

        context = sample.get("context")
        return cls(str(sample.get("kind", "")), str(sample.get("responder", "")), str(sample.get("scenario", "")),
                   str(sample.get("session", "")), None if context is None else str(context), number("ms"),
                   number("turn_ms"), bool(sample.get("kept")))

    @property
    def run(self) -> str:
        """The run it belongs to: responder and network scenario."""
        return f"{self.responder} / {self.scenario}"

    @property
    def cell(self) -> str:
        """Its certification cell: responder, mutation context, network strategy."""
        return f"{self.responder} / {self.context} / {self.scenario}"


def canonical(obj: object) -> bytes:
    """The one byte string a JSON value signs as: sorted keys, no spaces, ASCII."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def leaf_hash(sample: object) -> bytes:
    return hashlib.sha256(b"\x00" + canonical(sample)).digest()


def merkle_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 Merkle tree hash of leaf hashes (the empty tree: sha256 of nothing)."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaves[0]
    k = 1 << ((len(leaves) - 1).bit_length() - 1)  # largest power of two < n
    return hashlib.sha256(b"\x01" + merkle_root(leaves[:k]) + merkle_root(leaves[k:])).digest()


def version_of(report: Mapping[str, object]) -> int:
    """The LST definitions a report was made under: ``header.lst_version`` (v3 on), else the
    version named in ``header.lst_definitions`` (v2 reports), else 2."""
    header = report.get("header")
    header = header if isinstance(header, Mapping) else {}
    version = header.get("lst_version")
    if isinstance(version, int):
        return version
    words = str(header.get("lst_definitions", "")).split()
    return int(words[-1]) if words and words[-1].isdigit() else 2


def verdict_of(samples: Sequence[Mapping[str, object]], version: int = LST_VERSION) -> JSONObject:
    """The verdict the samples support, by the rules of ``version``: LST figures and tier overall and
    per run (responder / scenario), turn latency; from v3 on also SEQ-Integrity (``seq`` samples)
    and, where samples name their mutation context, per cell (responder / context / network).
    ITL streams are one session's ITLs in sample order (as its meter saw them). ValueError when a
    sample cannot be read."""
    judged = [JudgedSample.of(s) for s in samples]
    if version <= 2:
        return _verdict_v2(judged)
    return _verdict_v3(judged)


def _judge(group: list[JudgedSample], version: int) -> JSONObject:
    streams: dict[str, list[float]] = {}
    for s in group:
        if s.kind == "itl" and s.ms is not None:
            streams.setdefault(f"{s.run}/{s.session}", []).append(s.ms)
    out: JSONObject = dict(judge_samples([s.ms for s in group if s.kind == "ttft" and s.ms is not None],
                                         list(streams.values()), version))
    turns = [s.turn_ms for s in group if s.kind == "ttft" and s.turn_ms is not None]
    for q in (50, 95):
        v = percentile(turns, q)
        out[f"turn_ms_p{q}"] = None if v is None else round(v, 3)
    return out


def _verdict_v2(samples: list[JudgedSample]) -> JSONObject:
    """Version 2's verdict, byte for byte as v2 wrote it (old certificates verify unchanged)."""
    verdict = _judge(samples, 2)
    runs = sorted({s.run for s in samples})
    verdict["by_scenario"] = {name: _judge([s for s in samples if s.run == name], 2) for name in runs}
    return verdict


def _verdict_v3(samples: list[JudgedSample]) -> JSONObject:
    def judge(group: list[JudgedSample]) -> JSONObject:
        out = _judge(group, 3)
        seq = [s for s in group if s.kind == "seq"]
        out["seq_answers"] = len(seq)
        out["seq_integrity"] = round(sum(s.kept for s in seq) / len(seq), 4) if seq else None
        return out

    verdict = judge(samples)
    runs = sorted({s.run for s in samples})
    verdict["by_scenario"] = {name: judge([s for s in samples if s.run == name]) for name in runs}
    cells = sorted({s.cell for s in samples if s.context})
    if cells:
        verdict["by_cell"] = {name: judge([s for s in samples if s.cell == name]) for name in cells}
    return verdict


def _signed_part(report: Mapping[str, object]) -> bytes:
    return canonical({k: report.get(k) for k in ("format", "header", "merkle_root", "verdict")})


def build_report(header: JSONObject, samples: Sequence[JSONObject], key: Ed25519PrivateKey) -> JSONObject:
    """The signed report: samples, their leaf hashes, the root, the verdict, the signature."""
    leaves = [leaf_hash(s) for s in samples]
    report: JSONObject = {"format": FORMAT, "header": header, "samples": list(samples),
                          "leaf_hashes": [h.hex() for h in leaves], "merkle_root": merkle_root(leaves).hex(),
                          "verdict": verdict_of(samples, version_of({"header": header}))}
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    report["signature"] = {"algorithm": "ed25519", "public_key": public.hex(),
                           "value": key.sign(_signed_part(report)).hex()}
    return report


@dataclass(frozen=True)
class Verification:
    ok: bool
    problems: tuple[str, ...]


def verify_report(report: Mapping[str, object], public_key: Ed25519PublicKey) -> Verification:
    """Every check, in order; ``problems`` says what failed in words."""
    problems: list[str] = []
    if report.get("format") != FORMAT:
        return Verification(False, (f"not a {FORMAT} report (format {report.get('format')!r})",))
    samples, stored = report.get("samples", []), report.get("leaf_hashes", [])
    if not isinstance(samples, list) or not isinstance(stored, list):
        return Verification(False, ("the report's samples or leaf hashes are not lists",))
    for i, sample in enumerate(samples):
        try:
            JudgedSample.of(sample)
        except ValueError as exc:
            return Verification(False, (f"sample {i} is not a sample: {exc}",))
    if len(samples) != len(stored):
        problems.append(f"{len(samples)} samples but {len(stored)} leaf hashes: a sample was added or removed")
    leaves = []
    for i, sample in enumerate(samples):
        h = leaf_hash(sample)
        leaves.append(h)
        if i < len(stored) and h.hex() != stored[i]:
            problems.append(f"sample {i} ({sample.get('scenario')}, {sample.get('kind')} {sample.get('ms')} ms) "
                            "does not match its leaf hash: the sample was changed")
    root = merkle_root(leaves).hex()
    if root != report.get("merkle_root"):
        stated_root = str(report.get("merkle_root"))[:16]
        problems.append(f"the samples' Merkle root {root[:16]}… is not the report's {stated_root}…")
    expected = verdict_of(samples, version_of(report))
    if canonical(expected) != canonical(report.get("verdict")):
        given = report.get("verdict")
        stated = given.get("tier") if isinstance(given, Mapping) else None
        problems.append(f"the verdict does not follow from the samples (they give tier {expected['tier']}, "
                        f"TTFT99 {expected['ttft_ms_p99']} ms, jitter {expected['jitter_ms']} ms; "
                        f"the report says tier {stated})")
    sig = report.get("signature")
    sig = sig if isinstance(sig, Mapping) else {}
    try:
        public_key.verify(bytes.fromhex(str(sig.get("value", ""))), _signed_part(report))
    except (InvalidSignature, ValueError):
        own = public_bytes_hex(public_key)
        who = "" if sig.get("public_key") == own else " (the report names another signing key)"
        problems.append("the signature does not verify with the given public key: the header, root or verdict "
                        f"changed after signing, or another key signed it{who}")
    except KeyError as exc:
        problems.append(f"signature missing: {exc}")
    return Verification(not problems, tuple(problems))


def public_bytes_hex(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def load_or_create_key(path: Path) -> tuple[Ed25519PrivateKey, bool]:
    """The operator's signing key (PEM, unencrypted); made (mode 0600, ``PATH.pub`` beside it) if absent."""
    if path.exists():
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{path} is not an unencrypted PEM private key: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
        return key, False
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    write_public_key(key, public_key_path(path))
    return key, True


def public_key_path(key_path: Path) -> Path:
    return key_path.with_name(key_path.name + ".pub")


def write_public_key(key: Ed25519PrivateKey, path: Path) -> None:
    path.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                   serialization.PublicFormat.SubjectPublicKeyInfo))


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read a PEM public key from {path}: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path} holds a {type(key).__name__}, not an Ed25519 public key")
    return key
