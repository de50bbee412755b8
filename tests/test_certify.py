"""`synchrony certify` / `verify`: a real run's signed report verifies; any single change does not."""

from __future__ import annotations

import argparse
import asyncio
import copy
import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.live.server import ServerConfig, create_app, running_server
from app.loadtest import certificate
from app.loadtest.certify import QUICK_TURNS, certify_run, main, render_html, verify_main, workload_clip
from tests.live_fixtures import live_stages  # noqa: F401 - pytest fixture


@pytest.fixture(scope="module")
def key(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "operator.key"
    k, made = certificate.load_or_create_key(path)
    assert made and (path.stat().st_mode & 0o777) == 0o600
    assert certificate.load_or_create_key(path)[0].private_bytes_raw() == k.private_bytes_raw()  # reloads
    return path


@pytest.fixture(scope="module")
def report(live_stages, key, tmp_path_factory):  # noqa: F811
    """One real certification run: the quick workload once over WebRTC to a live server."""
    out = tmp_path_factory.mktemp("cert")

    async def run() -> tuple[dict, list]:
        app = create_app(ServerConfig.in_process(ui=False, output_delay_s=0.9), stages=live_stages)
        async with running_server(app) as base:
            args = argparse.Namespace(url=f"{base}/whip", spawn_server=False, responder=["caption"], netem=["clean"],
                                      workload="quick", loops=1, seed=0, token=None, standin_ttft_ms=100.0,
                                      argv=["--url", f"{base}/whip", "--workload", "quick", "--loops", "1"])
            return await certify_run(args, out)

    header, samples = asyncio.run(run())
    signing_key, _ = certificate.load_or_create_key(key)
    rep = certificate.build_report(header, samples, signing_key)
    path = out / "certificate.json"
    path.write_text(json.dumps(rep))
    return rep, path


def _verify(rep: dict, key_path) -> certificate.Verification:
    rep = json.loads(json.dumps(rep))  # as read back from disk
    return certificate.verify_report(rep, certificate.load_public_key(certificate.public_key_path(key_path)))


def test_live_report_has_raw_samples_and_verifies(report, key, capsys):
    rep, path = report
    kinds = [s["kind"] for s in rep["samples"]]
    assert kinds.count("ttft") >= 1 and kinds.count("itl") >= 3, rep["header"]["runs"]
    first = next(s for s in rep["samples"] if s["kind"] == "ttft")
    assert first["ms"] >= 0 and first["turn_ms"] > first["ms"]  # the turn includes deciding it ended
    assert first["turn"] in {t.name for t in QUICK_TURNS}
    v = rep["verdict"]
    assert v["responses"] == kinds.count("ttft") and v["tier"] in ("gold", "silver", "bronze", "none")
    assert set(v["by_scenario"]) == {"server / clean"}
    html = render_html(rep)
    assert html.count("<svg") == 2 and rep["merkle_root"] in html
    assert _verify(rep, key).ok
    assert verify_main([str(path), "--pubkey", str(certificate.public_key_path(key))]) == 0
    assert capsys.readouterr().out.startswith("OK:")


def test_changing_any_one_sample_fails(report, key):
    rep, _ = report
    for i in range(len(rep["samples"])):
        bad = copy.deepcopy(rep)
        bad["samples"][i]["ms"] = round(bad["samples"][i]["ms"] + 0.001, 3)
        result = _verify(bad, key)
        assert not result.ok and any(p.startswith(f"sample {i} ") for p in result.problems), result.problems
    bad = copy.deepcopy(rep)
    del bad["samples"][-1]
    assert "a sample was added or removed" in " ".join(_verify(bad, key).problems)


def test_a_rehashed_forgery_still_fails_on_the_signature(report, key):
    """Change a sample and recompute its leaf, the root and the verdict: only the key can sign that."""
    rep, _ = report
    bad = copy.deepcopy(rep)
    first = next(i for i, s in enumerate(bad["samples"]) if s["kind"] == "ttft")
    bad["samples"][first]["ms"] = 10.0
    leaves = [certificate.leaf_hash(s) for s in bad["samples"]]
    bad["leaf_hashes"] = [h.hex() for h in leaves]
    bad["merkle_root"] = certificate.merkle_root(leaves).hex()
    bad["verdict"] = certificate.verdict_of(bad["samples"])
    (problem,) = _verify(bad, key).problems
    assert problem.startswith("the signature does not verify")


def test_changing_the_verdict_fails(report, key):
    rep, _ = report
    bad = copy.deepcopy(rep)
    bad["verdict"]["tier"] = "gold" if rep["verdict"]["tier"] != "gold" else "bronze"
    problems = _verify(bad, key).problems
    assert any(p.startswith("the verdict does not follow from the samples") for p in problems)
    assert any(p.startswith("the signature does not verify") for p in problems)


def test_changing_the_signature_or_the_key_fails(report, key, tmp_path, capsys):
    rep, _ = report
    bad = copy.deepcopy(rep)
    value = bad["signature"]["value"]
    bad["signature"]["value"] = ("0" if value[0] != "0" else "1") + value[1:]
    (problem,) = _verify(bad, key).problems
    assert problem.startswith("the signature does not verify")
    other = tmp_path / "other.key"
    certificate.load_or_create_key(other)
    result = certificate.verify_report(rep, certificate.load_public_key(certificate.public_key_path(other)))
    assert not result.ok and "another signing key" in result.problems[0]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    assert verify_main([str(path), "--pubkey", str(certificate.public_key_path(key))]) == 1
    assert "FAILED: the signature does not verify" in capsys.readouterr().out
    assert verify_main([str(tmp_path / "missing.json"), "--pubkey", str(certificate.public_key_path(key))]) == 2
    assert verify_main([str(path), "--pubkey", str(path)]) == 2  # not a key: a clear error, no traceback
    assert "synchrony verify: cannot read a PEM public key" in capsys.readouterr().err


def test_merkle_tree_is_rfc6962():
    leaves = [hashlib.sha256(bytes([i])).digest() for i in range(3)]

    def node(a: bytes, b: bytes) -> bytes:
        return hashlib.sha256(b"\x01" + a + b).digest()

    assert certificate.merkle_root(leaves[:1]) == leaves[0]
    assert certificate.merkle_root(leaves) == node(node(leaves[0], leaves[1]), leaves[2])
    assert certificate.leaf_hash({"b": 1, "a": 2}) == hashlib.sha256(b'\x00{"a":2,"b":1}').digest()


def test_certify_usage_errors_are_one_line(tmp_path, capsys):
    key = tmp_path / "k.key"
    assert main(["--url", "http://192.0.2.10:8000/whip", "--key", str(key)]) == 2
    assert main(["--url", "http://127.0.0.1:1/whip", "--key", str(key), "--loops", "0"]) == 2
    key.write_text("not a key")
    assert main(["--url", "http://127.0.0.1:1/whip", "--key", str(key)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("synchrony certify:") == 3
    wrong = tmp_path / "rsa.key"
    wrong.write_bytes(Ed25519PrivateKey.generate().public_key().public_bytes(
        certificate.serialization.Encoding.PEM, certificate.serialization.PublicFormat.SubjectPublicKeyInfo))
    assert main(["--url", "http://127.0.0.1:1/whip", "--key", str(wrong)]) == 2


def test_workload_clip_marks_each_turn_end():
    w = workload_clip(QUICK_TURNS)
    assert len(w.speech_ends) == 2 and 0.6 < w.speech_ends[0] < w.speech_ends[1] < w.clip.duration
    assert len(w.clip.frames) == int(w.clip.duration * 25)


def test_the_load_step_turns_strain_the_face_and_the_shipped_controller_reads_both_steps():
    """The workload's load step and truncation, driven through the media: the real face extractor and
    the shipped controller read level 0 on the talking face, then a step to 2 and one to 3, each
    within 1.5 s of the face straining (so inside the answer that follows the turn)."""
    from app.loadtest.certify import STANDARD_TURNS
    from app.loadtest.stepclip import controller_reading, level_changes

    turns = tuple(t for t in STANDARD_TURNS if t.name in ("plain", "cut short", "load step", "truncated"))
    w = workload_clip(turns)
    assert [amount for _, amount in w.strains] == [0.6, 1.0]
    changes = level_changes(controller_reading(w.clip.frames, w.clip.fps))
    assert [level for _, level in changes] == [0, 2, 3], changes
    for (at, _), (read, _) in zip(w.strains, changes[1:], strict=True):
        assert at <= read <= at + 1.5, changes
    assert w.speech_ends[-1] + 1.0 < changes[-1][0] < w.clip.duration


def test_a_v2_certificate_still_verifies_by_v2_rules():
    """tests/data/lst_v2_certificate.json was signed by the v2 code; verify judges it by v2's rules."""
    from pathlib import Path

    data = Path(__file__).parent / "data"
    rep = json.loads((data / "lst_v2_certificate.json").read_text())
    public = certificate.load_public_key(data / "lst_v2_certificate.pub")
    assert certificate.version_of(rep) == 2
    assert certificate.verify_report(rep, public).ok
    assert certificate.canonical(certificate.verdict_of(rep["samples"], 2)) == certificate.canonical(rep["verdict"])
    assert certificate.verdict_of(rep["samples"])["lst_version"] == 3  # today's rules differ: v2 is kept apart
    bad = copy.deepcopy(rep)
    bad["samples"][0]["ms"] += 1.0
    assert not certificate.verify_report(bad, public).ok


def test_v3_verdict_carries_seq_integrity_per_cell():
    samples = [
        {"scenario": "clean", "responder": "openai", "context": "tool calls", "session": "s", "kind": "ttft",
         "ms": 90.0, "turn_ms": 300.0},
        {"scenario": "clean", "responder": "openai", "context": "tool calls", "session": "s", "kind": "itl",
         "ms": 83.0},
        {"scenario": "clean", "responder": "openai", "context": "tool calls", "session": "s", "kind": "seq",
         "kept": True},
        {"scenario": "clean", "responder": "openai", "context": "truncation", "session": "s", "kind": "seq",
         "kept": False},
    ]
    v = certificate.verdict_of(samples, 3)
    assert v["lst_version"] == 3 and v["seq_answers"] == 2 and v["seq_integrity"] == 0.5
    assert v["by_cell"]["openai / tool calls / clean"]["seq_integrity"] == 1.0
    assert v["by_cell"]["openai / truncation / clean"]["seq_integrity"] == 0.0


def test_v3_samples_judge_itl_at_the_peer_ttft_at_the_server_and_seq_against_the_log():
    from types import SimpleNamespace

    from app.loadtest.cells import samples_v3
    from app.loadtest.llm_standin import StandInAnswer

    log = [StandInAnswer("c1", "hi", "Sure, synchrony.", "Sure, synchrony.", (), "stop", True),
           StandInAnswer("c2", "umbrella", "", "", ("get_weather", "{}"), "tool_calls", True)]
    msgs = [(10.00, {"type": "response", "utterance": 0, "index": 0, "text": "Sure,", "ttft_ms": 80.0,
                     "turn_ms": 300.0, "hold_ms": 120.0, "ms_after_utterance": 300.0, "completion": "c1"}),
            (10.09, {"type": "response", "utterance": 0, "index": 1, "text": "synchrony.", "itl_ms": 83.3})]
    events = [SimpleNamespace(wall=w, message=m) for w, m in msgs]
    got = samples_v3(events, 0.0, lambda t: ("plain", "plain"), "clean", "openai", "s", cold_until=5.0, log=log)
    by = {s["kind"]: s for s in got}
    assert by["ttft"]["ms"] == 80.0 and by["ttft"]["hold_ms"] == 120.0 and by["ttft"]["context"] == "plain"
    assert by["itl"]["ms"] == pytest.approx(90.0) and by["server_itl"]["ms"] == 83.3  # the peer's gap is judged
    seq = [s for s in got if s["kind"] == "seq"]
    assert len(seq) == 2 and all(s["kept"] for s in seq)  # the answer, and the tool-only one (nothing shown)
    cold = samples_v3(events, 0.0, lambda t: ("plain", "plain"), "clean", "openai", "s", cold_until=60.0, log=None)
    assert {s["context"] for s in cold} == {"cold start"} and not [s for s in cold if s["kind"] == "seq"]
