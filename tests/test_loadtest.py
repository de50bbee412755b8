"""The load-test kit (rounds, metrics, report): figures from truth, guard rails, and one short live run."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from alignment.types import SAMPLE_RATE
from app.loadtest import cli, config, drive, loopclip, rounds, spawn, verdict
from app.loadtest import metrics as lm
from app.loadtest import report as loadreport
from app.loadtest.records import RampVerdict, RoundResult


@pytest.fixture(scope="module")
def loop_clip():
    return loopclip.make_loop_clip(config.DEFAULT_TEXT, 0.0, (320, 180), 25.0)


def test_loop_clip_loops_without_drift(loop_clip):
    n = len(loop_clip.audio)
    assert n % (SAMPLE_RATE // 25) == 0 and n % (SAMPLE_RATE // 50) == 0  # whole video and 20 ms frames
    assert len(loop_clip.frames) == n // (SAMPLE_RATE // 25)
    truth = lm.clip_truth(loop_clip)
    assert [w.text for w in truth.words] == config.DEFAULT_TEXT.split()
    assert all(w.start < w.end for w in truth.words)
    assert all(a.end <= b.start + 1e-9 for a, b in zip(truth.words, truth.words[1:], strict=False))
    assert truth.markers[0] < truth.words[0].start and truth.markers[-1] > truth.utterance_end
    assert truth.period_s == pytest.approx(n / SAMPLE_RATE)


def test_the_peers_mic_carries_a_noise_floor_unless_told_not_to(loop_clip):
    """A live mic always carries noise, and the server's echo canceller reads digital silence as a muted or gated
    sender (it bounds nothing): the load test's peers send a floor by default, zeros when asked."""
    args = cli.build_parser().parse_args(["--spawn-server"])
    assert args.mic_noise_dbfs == config.DEFAULT_MIC_NOISE_DBFS
    assert cli.build_parser().parse_args(["--spawn-server", "--mic-noise-dbfs", "none"]).mic_noise_dbfs is None
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--spawn-server", "--mic-noise-dbfs", "-3"])
    noisy = loopclip.make_loop_clip(config.DEFAULT_TEXT, 0.0, (160, 120), 25.0, mic_noise_dbfs=-70.0)
    lead_in = slice(0, int(0.2 * SAMPLE_RATE))  # before the first marker (0.22 s) and the speech
    level = 10 * np.log10(np.mean(noisy.audio[lead_in] ** 2))
    assert -71.0 < level < -69.0 and not np.any(noisy.audio[lead_in] == 0.0)
    assert not np.any(loop_clip.audio[lead_in]), "without a floor the lead-in is digital silence"


def _token_events(truth: lm.ClipTruth, reps: int, lag: float, delay: float, skip: set[int]):
    """Token messages for every word, stamped ``lag`` early on the server clock, arriving ``delay`` after the end."""
    out, k = [], 0
    for r in range(reps):
        for i, w in enumerate(truth.words):
            k += 1
            if k in skip:
                continue
            start = r * truth.period_s + w.start - lag
            end = r * truth.period_s + w.end
            out.append((end + delay, {"type": "token", "text": w.text.capitalize() + ",", "start": start,
                                      "end": end - lag, "final": False, "utterance": r, "index": i}))
            out.append((end + delay + 0.3, {"type": "token", "text": w.text, "start": start, "end": end - lag,
                                            "final": True, "utterance": r, "index": i}))
    return sorted(out, key=lambda x: x[0])


def test_match_tokens_recovers_latency_lag_and_misses(loop_clip):
    truth = lm.clip_truth(loop_clip)
    n_words = len(truth.words)
    tokens = _token_events(truth, 3, lag=0.12, delay=0.4, skip={3, n_words + 5})
    words, lag, unmatched = lm.match_tokens(truth, tokens, until_s=3 * truth.period_s)
    assert len(words) == 3 * n_words
    assert lag == pytest.approx(0.12, abs=1e-6)
    assert unmatched == 0
    got = [w for w in words if w.latency_s is not None]
    assert len(got) == 3 * n_words - 2
    assert all(w.latency_s == pytest.approx(0.4) and w.final_latency_s == pytest.approx(0.7) for w in got)
    summary = lm.summarise_latencies(words)
    assert summary.recall == pytest.approx((3 * n_words - 2) / (3 * n_words), abs=1e-4)
    assert summary.latency_ms_p95 == pytest.approx(400.0, abs=0.1)
    # A token for a word nobody said (in the pause after the sentence) is counted, not matched.
    gap = truth.utterance_end + 0.05
    extra = [(gap + 1, {"type": "token", "text": "zebra", "start": gap, "end": gap + 0.2, "final": True})]
    assert lm.match_tokens(truth, tokens + extra, 3 * truth.period_s)[2] == 1
    # A misheard word over the skipped word's interval stands for it: matched by time, not by text.
    skipped = truth.words[2]  # the word skip={3} left without a token
    misheard = [(skipped.end + 0.5, {"type": "token", "text": "round", "start": skipped.start - 0.12,
                                   "end": skipped.end - 0.12, "final": True})]
    words2, _, unmatched2 = lm.match_tokens(truth, tokens + misheard, 3 * truth.period_s)
    assert unmatched2 == 0
    assert words2[2].matched_by == "time" and words2[2].latency_s == pytest.approx(0.5)
    s2 = lm.summarise_latencies(words2)
    assert s2.recall > summary.recall and s2.recall_text == summary.recall_text
    # The same token arriving before that word began cannot stand for it (a long guessed interval).
    early = [(skipped.start - 0.05, misheard[0][1])]
    words3, _, unmatched3 = lm.match_tokens(truth, tokens + early, 3 * truth.period_s)
    assert unmatched3 == 1 and words3[2].latency_s is None


def test_client_turn_latency_itl_and_jitter():
    truth = lm.ClipTruth((lm.TruthWord("hi", 0.5, 1.0),), (), 4.0, 0.0)
    # Utterance 0 ends at 1.0 s: first response 150 ms later, then tokens 100 ms apart with one 40 ms wobble.
    arrivals = [1.15 + 0.1 * i for i in range(10)]
    arrivals[5] += 0.04
    responses = [(t, {"type": "response", "utterance": 0, "index": i}) for i, t in enumerate(arrivals)]
    responses += [(5.2, {"type": "response", "utterance": 1, "index": 0})]  # utterance 1 ends at 5.0
    got = lm.turn_latency_and_itl(truth, responses, until_s=8.0)
    assert got.utterances == 2
    assert got.turn_ms == pytest.approx([150.0, 200.0], abs=0.2)
    assert got.itl_ms_max == pytest.approx(140.0, abs=0.2)
    gaps = np.diff(arrivals)
    assert got.jitter_ms_max == pytest.approx(max(np.std(gaps[i - 8 : i]) for i in range(8, 10)) * 1000, abs=0.2)


def test_level3_flags_evidence_offsets_only():
    def sync(video_minus_audio_ms: float, ok: bool, evidence: str = "markers") -> dict:
        return {"type": "sync", "audio": 1.0, "video": 1.0 + video_minus_audio_ms / 1000, "text": 1.0,
                "max_delta_ms": abs(video_minus_audio_ms), "ok": ok, "evidence": evidence}

    clean = lm.level3([sync(5, True), sync(-8, True), sync(12, True), sync(900, False, "assigned")])
    assert clean.pass_rate == 0.75 and not clean.flagged and clean.evidence_checks == 3
    late = lm.level3([sync(148, False), sync(155, False), sync(151, False)])
    assert late.flagged and late.video_minus_audio_ms_p50 == pytest.approx(151.0)
    assert not lm.level3([]).flagged
    assert [f.why for f in clean.failed] == ["delta"] and len(late.failed) == 3


def test_level3_says_why_each_check_failed():
    base = {"type": "sync", "token": "w", "audio": 2.0, "video": 2.0, "evidence": "markers"}
    late = {**base, "text": 2.4, "max_delta_ms": 400.0, "ok": False}
    unplaced = {**base, "text": None, "max_delta_ms": None, "ok": False}
    off_onset = {**base, "text": 2.01, "max_delta_ms": 10.0, "audio_error_ms": -90.0, "ok": False}
    shown_off = {**base, "video": 2.08, "text": 2.0, "max_delta_ms": 80.0, "ok": False}
    passed = {**base, "text": 2.0, "max_delta_ms": 0.0, "ok": True}
    failed = lm.level3([late, unplaced, passed, off_onset, shown_off]).failed
    assert [f.why for f in failed] == ["late", "no_frame", "onset", "delta"]
    assert failed[2].audio_error_ms == -90.0
    assert len(lm.level3([late] * 50).failed) == lm.FAILED_KEPT


def test_flash_lags_pair_each_click_with_the_next_flash():
    truth = lm.ClipTruth((lm.TruthWord("a", 1.0, 1.2),), (0.25, 3.5), 4.0, 0.0)
    flashes = [0.25 + 1.0, 3.5 + 1.05, 4.25 + 0.98]  # the 4th click's flash never came back
    assert lm.flash_lags(truth, flashes, until_s=12.0) == pytest.approx([1.0, 1.05, 0.98])


def test_loopback_only_and_bad_input_is_a_clear_error(capsys, tmp_path):
    assert spawn.check_loopback_url("http://127.0.0.1:8000/whip") == "http://127.0.0.1:8000/whip"
    assert spawn.check_loopback_url("http://localhost:8000") == "http://localhost:8000/whip"
    for url in ("http://192.0.2.2:8000/whip", "http://10.1.2.3/whip", "ftp://127.0.0.1/whip", "nonsense"):
        with pytest.raises(ValueError):
            spawn.check_loopback_url(url)
    out = str(tmp_path)
    for argv in (["--url", "http://192.0.2.2:8000/whip"], ["--spawn-server", "--peers", "0"],
                 ["--spawn-server", "--peers", "1000"], ["--spawn-server", "--netem", "loss=lots"],
                 ["--spawn-server", "--duration", "1"], ["--spawn-server", "--video-size", "big"]):
        assert cli.main([*argv, "--out", out]) == config.EXIT_USAGE
        err = capsys.readouterr().err
        assert err.startswith("synchrony loadtest:") and "Traceback" not in err


def test_plan_spreads_peers_and_applies_offsets():
    specs = config.plan_peers(5, 2, 0.5, {4: 150.0}, "loss5")
    assert [s.worker for s in specs] == [0, 1, 0, 1, 0]
    assert [s.start_s for s in specs] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert [s.offset_ms for s in specs] == [0, 0, 0, 0, 150.0] and {s.netem for s in specs} == {"loss5"}


@pytest.mark.timeout(240)
def test_live_run_two_peers_flags_the_injected_offset(tmp_path):
    """Two real peers against a server this test starts on 127.0.0.1; one sends video 150 ms late."""
    out = tmp_path / "lt"
    code = cli.main(["--spawn-server", "--peers", "2", "--offset-ms", "150", "--offset-peers", "1",
                          "--duration", "10", "--max-duration", "40", "--min-sync-checks", "3",
                          "--stagger", "0.3", "--decode-answer", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    html = (out / "report.html").read_text()
    # Self-contained: inline SVG, nothing fetched (no scripts, stylesheets, or remote src/href).
    assert "<svg" in html and not re.search(r"<script|<link|(src|href)=\"(https?:)?//", html)
    rnd = report["rounds"][0]
    clean, late = rnd["peers"]
    assert clean["connected"] and late["connected"], (clean.get("error"), late.get("error"))
    for p in (clean, late):
        # Counts agree with each other and latencies are physical: a word's first token (an interim
        # may guess a word before its end) comes after the word began, its final after it ended,
        # both within the run.
        assert p["events"].get("token", 0) == len(p["tokens"])
        assert p["latency"]["matched"] <= p["latency"]["words"] == len(p["words"]) > 0
        heard = [w for w in p["words"] if w[2] is not None]
        assert heard, "no spoken word came back as a token"
        assert all(0.0 < w[2] - w[0] < p["run_s"] for w in heard)
        final = [w for w in heard if w[3] is not None]
        assert final and all(0.0 < w[3] - w[1] < p["run_s"] for w in final)
        assert p["frames_received"] > 0 and 0 < p["first_video_ms"] < 30_000
        assert p["level3"]["checks"] == p["events"].get("sync", 0) == len(p["sync_timeline"])
        assert p["level3"]["evidence_checks"] >= 1
        assert all(x > 0 for x in p["flash_lag_ms"])
    print(f"clean: {clean['level3']}\nlate: {late['level3']}")
    assert not clean["level3"]["flagged"], clean["level3"]
    assert late["level3"]["flagged"], late["level3"]
    assert late["level3"]["video_minus_audio_ms_p50"] == pytest.approx(150.0, abs=40.0)
    assert report["result"]["detection"] == {"offset_ms": 150.0, "flagged": 1, "of": 1, "clean_flagged": 0}
    assert code == config.EXIT_OK
    assert any(s[1] is not None and not math.isnan(s[1]) for s in rnd["cpu"])  # server CPU was sampled
    # ... and its steady part, while both sessions were live (the server's /readyz), was told apart
    steady = rnd["aggregate"]["cpu_all_live"]
    assert steady is not None and 0 < steady["samples"] < len(rnd["cpu"]) and steady["server"] > 0
    assert max(k for _, k in rnd["sessions"]) == 2
    # The server-measured LST samples came back on the response events and were judged for the round.
    lst = rnd["aggregate"]["lst"]
    assert lst["responses"] == sum(len(p["lst_ttft_ms"]) for p in (clean, late)) > 0
    assert lst["ttft_ms_p99"] is not None and lst["tier"] in ("gold", "silver", "bronze", "none")
    # The spoken answers came back and were measured at the peers (--decode-answer), from the clip's truth.
    for p in (clean, late):
        a = p["answer"]
        assert a["decoded"] and a["starts"] > 0 and a["audio_packets"] > 0, a
        assert a["voice_to_voice_ms"] and all(0 < x < 10_000 for x in a["voice_to_voice_ms"]), a
    pooled = rnd["aggregate"]["answer"]
    assert pooled["answers"] >= 2 and pooled["voice_to_voice_ms_p50"] is not None
    assert "spoken answers:" in loadreport.text_summary(report)


def test_steady_cpu_is_the_mean_over_the_samples_with_every_session_live():
    from app.loadtest.cpusampler import steady_cpu

    cpu = [(0.5, 5.0, 180.0, 95.0), (1.5, 120.0, 20.0, 75.0), (2.5, 140.0, 20.0, 85.0), (3.5, 30.0, 10.0, 25.0)]
    sessions = [(0.4, 0), (1.2, 1), (1.4, 2), (3.2, 1)]  # (t, live) from /readyz, where it changed
    steady = steady_cpu(cpu, sessions, 2)
    assert steady is not None and steady.samples == 2  # the clip building and the teardown left out
    assert steady.server == 130.0 and steady.clients == 20.0
    assert steady.machine == 80.0 * steady.cores  # psutil's machine % is of all cores
    assert steady_cpu(cpu, sessions, 3) is None and steady_cpu(cpu, [], 1) is None


def test_require_lst_is_a_round_bound():
    """--require-lst: the round's LST tier from the peers' server-measured samples; a stall breaks Gold."""
    even = [83.3] * 20
    peers = [{"index": 0, "offset_ms": 0.0, "connected": True, "words": [[0.0, 0.3, 0.5, 0.9, "w"]],
              "level3": {"checks": 5, "ok": 5, "flagged": False},
              "lst_ttft_ms": [30.0, 41.0], "lst_itl_ms": even},
             {"index": 1, "offset_ms": 0.0, "connected": True, "words": [[0.0, 0.3, 0.5, 0.9, "w"]],
              "level3": {"checks": 5, "ok": 5, "flagged": False},
              "lst_ttft_ms": [35.0], "lst_itl_ms": even[:10] + [140.0] + even[10:]}]
    agg = verdict.aggregate(peers, require_lst="silver")
    assert agg["lst"]["responses"] == 3 and agg["lst"]["itl_ms_max"] == 140.0
    assert agg["lst"]["tier"] == "none"  # one 57 ms stall: worst σ8 = 56.7·√7/8 = 18.7 ms
    assert agg["bounds"]["checks"]["LST tier >= silver"] is False and not agg["bounds"]["ok"]
    peers[1]["lst_itl_ms"] = even
    agg = verdict.aggregate(peers, require_lst="silver")
    assert agg["lst"]["tier"] == "gold" and agg["bounds"]["ok"]
    assert "LST tier >= silver" not in verdict.aggregate(peers)["bounds"]["checks"]  # off unless asked


def test_find_max_ramps_until_a_bound_breaks(monkeypatch, capsys, tmp_path):
    """The ramp logic on synthetic rounds: word latency is 150 ms per peer, so p95 > 1 s from 7 peers on."""
    seen: list[int] = []

    def fake_round(specs, cfg, pid):
        n = len(specs)
        seen.append(n)
        peers = [{"index": s.index, "offset_ms": 0.0, "connected": True,
                  "words": [[t, t + 0.3, t + 0.3 + 0.15 * n, None, "w"] for t in np.arange(0.0, 20.0, 0.5)],
                  "level3": {"checks": 10, "ok": 10, "flagged": False}} for s in specs]
        return RoundResult(peers=[], aggregate=verdict.aggregate(peers))

    monkeypatch.setattr(rounds, "run_round", fake_round)
    monkeypatch.setattr(rounds.time, "sleep", lambda s: None)
    args = cli.build_parser().parse_args(["--url", "http://127.0.0.1:1/whip", "--find-max", "--peers", "2",
                                               "--step", "2", "--max-peers", "16"])
    cli._validate(args)
    cfg = config.RoundConfig(url="http://127.0.0.1:1/whip")
    report = rounds.run_plan(args, cfg, None)
    assert seen == [2, 4, 6, 8]  # 8 peers: 0.15 · 8 = 1.2 s > 1 s
    assert report.result.peers_sustained == 6 and report.result.bound_broke_at == 8
    assert report.result.failed_checks == ["p95 word->token <= 1000 ms"]
    html = loadreport.render_html(report.to_json())
    assert html.count("<h2>Round") == 4
    # --keep-going draws the whole curve; what is sustained still stops at the first break.
    seen.clear()
    args = cli.build_parser().parse_args(["--url", "http://127.0.0.1:1/whip", "--find-max", "--peers", "2",
                                               "--step", "3", "--max-peers", "9", "--keep-going"])
    cli._validate(args)
    result = rounds.run_plan(args, cfg, None).result
    assert isinstance(result, RampVerdict)
    assert seen == [2, 5, 8, 9]
    assert result.peers_sustained == 5 and result.bound_broke_at == 8
    assert [c[0] for c in result.curve] == [2, 5, 8, 9]


def test_pre_encoded_vp8_loop_decodes_with_the_flash(loop_clip):
    import av

    packets = loopclip.encode_vp8_loop(loop_clip.frames, loop_clip.fps)
    assert len(packets) == len(loop_clip.frames)
    decoder = av.CodecContext.create("libvpx", "r")
    lit = []
    for i, data in enumerate(packets):
        for frame in decoder.decode(av.Packet(data)):
            lit.append((i, drive._flash_region_mean(frame)))
    flash_frames = [i for i, y in lit if y > 80.0]
    # Clean clip: markers at frame-cell starts light exactly frames 6 and (end - 8), and only those.
    assert flash_frames == [6, len(packets) - 8]


def test_records_write_the_reports_json_shape():
    """A peer that never connected, and a round around it, write the keys (and order) report.json always had."""
    from app.loadtest.records import PeerResult, PooledAnswers, RoundResult

    lost = PeerResult(3, 1, 0.0, "clean", error="no result (worker failed or timed out)")
    assert list(lost.to_json()) == ["index", "worker", "offset_ms", "netem", "connected", "error"]
    agg = verdict.aggregate([lost.to_json()])
    rnd = RoundResult(peers=[lost], aggregate=agg, answer=PooledAnswers(0, 0, 0)).to_json()
    assert list(rnd) == ["peers", "aggregate", "cpu", "sessions", "errors", "wall_s", "worker_cpu_s",
                         "worker_setup_cpu_s"]
    assert list(rnd["aggregate"])[-4:] == ["client_cpu_per_peer", "degradation", "cpu_all_live", "answer"]
    assert rnd["aggregate"]["answer"] == {"starts": 0, "audio_packets": 0, "avatar_frames": 0}
    assert json.loads(json.dumps(rnd))["peers"][0]["error"].startswith("no result")


async def test_the_stand_ins_answer_bad_requests_in_one_json_line():
    import httpx

    from app.loadtest.llm_standin import StandInLLM
    from app.loadtest.tts_standin import StandInTTS

    for server, route in ((StandInLLM(), "/chat/completions"), (StandInTTS(), "/audio/speech")):
        await server.start()
        try:
            async with httpx.AsyncClient(timeout=10) as client:
                missing = await client.post(server.base_url + "/nowhere", json={})
                not_object = await client.post(server.base_url + route, json=[1, 2])
                not_json = await client.post(server.base_url + route, content=b"{")
        finally:
            await server.stop()
        assert missing.status_code == 404 and "no route" in missing.json()["error"]["message"]
        assert not_object.status_code == 400 and "JSON object" in not_object.json()["error"]["message"]
        assert not_json.status_code == 400 and not_json.json()["error"]["message"].startswith("bad request")
        assert server.requests == 0
