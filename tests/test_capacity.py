"""Capacity: per-stage CPU from kernel counters, admission by measured CPU per session, the AU rate,
the returned video's encoder, and the light load-test peer's pre-encoded audio."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

from app.live.au import FrameRate
from app.live.cpu_account import CapacityEstimate, CpuAccount, name_native_thread, stage_of, usable_cores
from app.live.server import ServerConfig, create_app, running_server
from app.loadtest import cli, config, loopclip, verdict
from app.loadtest.peer import WhipError, WhipPeer


def _burn(seconds: float) -> None:
    t = time.thread_time()
    x = np.ones(2000)
    while time.thread_time() - t < seconds:
        x = np.sqrt(x + 1.0)


def test_thread_cpu_is_counted_to_its_stage_even_after_the_thread_ended():
    account = CpuAccount()
    if not account.available:
        pytest.skip("no /proc/self/task on this platform")
    before = account.sample()
    done = threading.Event()

    def lane() -> None:
        _burn(0.3)
        account.sample()  # while alive: its CPU is seen ...
        done.set()

    def native() -> None:
        name_native_thread("drishti-test")  # a native thread named by its library (MediaPipe's)
        _burn(0.2)
        account.sample()

    for target, name in ((lane, "asr-worker-test"), (native, "helper")):
        t = threading.Thread(target=target, name=name)
        t.start()
        t.join()
    after = account.sample()  # ... and kept once it is gone
    assert done.is_set()
    assert after["asr"] - before["asr"] >= 0.25
    assert after["faces"] - before["faces"] >= 0.15
    assert stage_of("render_0", "python") == "render" and stage_of("ThreadPoolExecutor-1_0", "au-abc") == "faces"
    assert stage_of(None, "python") == "other" and stage_of("MainThread", "python") == "event_loop"


def test_capacity_follows_the_measured_cost_per_session():
    clock = {"t": 0.0, "cpu": 0.0}
    est = CapacityEstimate(0.9, cores=2.0, target_utilisation=0.85, max_sessions=16, tau_s=5.0,
                           clock=lambda: clock["t"], cpu=lambda: clock["cpu"])

    def run(sessions: int, cores_used: float, seconds: int) -> None:
        for _ in range(seconds):
            clock["t"] += 1.0
            clock["cpu"] += cores_used
            est.update(sessions)

    assert est.update(0).sessions == 1 and not est.current().measured  # the prior: floor(1.7 / 0.9)
    run(0, 0.1, 60)  # idle: 0.1 core
    run(2, 0.1 + 2 * 0.25, 60)  # two sessions at 0.25 core each
    cap = est.current()
    assert cap.measured and cap.cost_cores == pytest.approx(0.25, abs=0.01)
    assert cap.idle_cores == pytest.approx(0.1, abs=0.01)
    assert cap.sessions == 6  # floor((1.7 - 0.1) / 0.25)
    run(3, 0.1 + 3 * 0.5, 60)  # sessions got dearer (e.g. more speech): capacity follows
    assert est.current().sessions == 3
    with pytest.raises(ValueError):
        CapacityEstimate(0.0)


def test_frame_rate_takes_16_of_25_camera_frames_by_pts():
    rate = FrameRate(16.0)
    assert sum(rate.take(k / 25) for k in range(250)) == 160
    slow = FrameRate(16.0)
    assert sum(slow.take(k / 10) for k in range(50)) == 50  # a slower camera: every frame
    assert slow.take(0.0)  # pts went back (clock step): taken, count restarts


def test_lean_encoder_encodes_decodable_vp8_cheaper():
    import av
    from aiortc.codecs.vpx import Vp8Encoder

    from app.live.video_encoder import LeanVp8Encoder

    clip = loopclip.make_loop_clip(config.DEFAULT_TEXT, 0.0, (640, 360), 25.0)
    frames = [av.VideoFrame.from_ndarray(f, format="rgb24") for f in clip.frames[:40]]
    cost = {}
    for enc in (Vp8Encoder(), LeanVp8Encoder()):
        payloads = []
        t = time.thread_time()
        for i, f in enumerate(frames):
            f.pts, f.time_base = i * 5625, __import__("fractions").Fraction(1, 90_000)
            payloads.append(enc.encode(f)[0])
        cost[type(enc).__name__] = time.thread_time() - t
        assert all(payloads)
    print(f"CPU for 40 frames: {cost}")
    assert cost["LeanVp8Encoder"] < cost["Vp8Encoder"]


def test_camera_conversion_with_a_converter_per_thread_gives_the_same_pixels_from_two_threads_at_once():
    import av

    from app.live.convert import rgb

    rng = np.random.default_rng(0)
    frames = [av.VideoFrame.from_ndarray(rng.integers(0, 256, (360, 640, 3), np.uint8), format="rgb24")
              .reformat(format="yuv420p") for _ in range(3)]
    got: dict[str, list[np.ndarray]] = {}

    def convert(name: str, size: tuple[int, int] | None) -> None:
        got[name] = [rgb(f, size) for f in frames for _ in range(20)]

    threads = [threading.Thread(target=convert, args=(n, s)) for n, s in (("full", None), ("half", (320, 180)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, f in enumerate(frames):
        assert np.array_equal(got["full"][20 * i], f.to_ndarray(format="rgb24"))
        assert np.array_equal(got["half"][20 * i], f.to_ndarray(format="rgb24", width=320, height=180))


@pytest.mark.timeout(60)  # the failure this guards against is a hang
def test_a_child_forked_after_a_thread_converted_a_frame_starts():
    """A fork clears the other threads' locals, so the child frees their converters; with libswscale
    slice threads that waited forever for threads the child does not have (the suite hung in Ray's
    first subprocess). Each converter now converts on its own thread."""
    import subprocess

    import av

    from app.live.convert import rgb

    frame = av.VideoFrame.from_ndarray(np.zeros((360, 640, 3), np.uint8), format="rgb24").reformat(format="yuv420p")
    converted, stop = threading.Event(), threading.Event()

    def convert_then_wait() -> None:
        rgb(frame)
        converted.set()
        stop.wait(30)

    t = threading.Thread(target=convert_then_wait, daemon=True)
    t.start()
    assert converted.wait(10)
    try:
        child = subprocess.Popen(["true"], preexec_fn=lambda: None)  # noqa: PLW1509 - the fork under test
        assert child.wait(timeout=10) == 0
    finally:
        stop.set()


def test_pre_encoded_opus_loop_carries_clip_frame_k_in_packet_k():
    from aiortc.codecs.opus import OpusDecoder
    from aiortc.jitterbuffer import JitterFrame

    from app.loadtest.peer import AUDIO_FRAME, ClipAudioTrack

    clip = loopclip.make_loop_clip(config.DEFAULT_TEXT, 0.0, (320, 180), 25.0)
    packets = loopclip.encode_opus_loop(clip.audio)
    pcm = ClipAudioTrack(clip.audio, None)._pcm.astype(np.float32)
    n = len(pcm)
    assert len(packets) == n // AUDIO_FRAME
    decoder = OpusDecoder()  # what the server runs on them
    out = [f.to_ndarray().reshape(-1, 2)[:, 0] for i, data in enumerate(packets + packets)  # second loop: steady
           for f in decoder.decode(JitterFrame(data=data, timestamp=i * AUDIO_FRAME))]
    second = np.concatenate(out).astype(np.float32)[n : 2 * n]
    corr = np.fft.irfft(np.fft.rfft(second) * np.conj(np.fft.rfft(pcm)), n)  # circular: the clip loops
    lag = int(np.argmax(corr))
    lag = lag if lag < n // 2 else lag - n
    peak = float(corr.max() / (np.linalg.norm(second) * np.linalg.norm(pcm)))
    print(f"decoded loop vs clip: correlation {peak:.3f} at {lag / 48:.1f} ms")
    assert peak > 0.9 and 0 <= lag <= 480  # the same audio, late by Opus's pre-skip only (6.5 ms)


async def test_full_by_measured_capacity_503_with_retry_after_and_capacity_in_readyz_and_metrics():
    black = np.zeros((90, 160, 3), np.uint8)
    silence = np.zeros(16000, np.float32)
    cost = usable_cores() * 0.85 / 1.6  # one session fits, two do not, on any machine
    app = create_app(ServerConfig.in_process(ui=False, stages=(), admission="measured", session_cost_cores=cost,
                                             max_sessions=4, retry_after_s=7, degrade=True))
    async with running_server(app) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            ready = (await client.get("/readyz")).json()
            assert ready["capacity"] == 1 and ready["max_sessions"] == 4 and ready["sessions"] == 0
            assert ready["admission"]["mode"] == "measured" and ready["admission"]["cost_cores"] > 0
            first = WhipPeer(f"{base}/whip", frames=[black], fps=10, audio=silence)
            await first.connect()
            second = WhipPeer(f"{base}/whip", frames=[black], fps=10, audio=silence)
            with pytest.raises(WhipError) as refused:
                await second.connect()
            assert refused.value.status == 503 and refused.value.retry_after == "7"
            assert "measured capacity" in refused.value.detail
            metrics = (await client.get("/metrics")).text
            assert "synchrony_capacity_sessions 1.0" in metrics
            assert 'synchrony_whip_rejected_total{status="503"} 1.0' in metrics
            assert 'synchrony_stage_cpu_seconds_total{stage="event_loop"}' in metrics
            app.state.degradation.level = 1  # shedding work (as after a second of overload): no new sessions
            ready = (await client.get("/readyz")).json()
            assert ready["capacity"] == 1 and ready["degradation"]["steps"] == ["au_rate"]
            third = WhipPeer(f"{base}/whip", frames=[black], fps=10, audio=silence)
            with pytest.raises(WhipError) as refused:
                await third.connect()
            assert refused.value.status == 503 and "overload" in refused.value.detail
            await first.close()
            # No session left, so no work to shed: the level drops to 0 at the next measurement (a
            # level left over would keep every new session out of an idle server).
            for _ in range(40):
                ready = (await client.get("/readyz")).json()
                if ready["degradation"]["level"] == 0:
                    break
                await asyncio.sleep(0.1)
            assert ready["degradation"]["level"] == 0 and ready["capacity"] == 1
            fourth = WhipPeer(f"{base}/whip", frames=[black], fps=10, audio=silence)
            await fourth.connect()
            await fourth.close()


def test_degradation_steps_down_the_order_under_overload_and_back_when_it_passes():
    from app.live.degrade import ORDER, Degradation, OverloadSignal

    deg = Degradation(enter_s=1.0, leave_s=5.0)
    calm = OverloadSignal(cpu_cores=1.0, usable_cores=2.0, asr_backlog_s=0.05)
    busy = OverloadSignal(cpu_cores=1.97, usable_cores=2.0, asr_backlog_s=0.05)
    behind = OverloadSignal(cpu_cores=1.2, usable_cores=2.0, asr_backlog_s=0.6)  # ASR backlog alone counts
    levels = [deg.update(calm, float(t)) for t in range(3)]
    levels += [deg.update(busy if t < 6 else behind, float(t)) for t in range(3, 10)]
    assert levels[:3] == [0, 0, 0]
    assert levels[3:] == [0, 1, 2, 3, 3, 3, 3]  # one step per second of overload, then the floor
    assert deg.effects.au_fps == 8.0 and deg.effects.output_scale == 0.5 and deg.effects.asr_step_s == 0.3
    back = [deg.update(calm, float(t)) for t in range(10, 27)]
    assert back[4] == 3 and back[5] == 2 and back[10] == 1 and back[15] == 0  # one step back per 5 s calm
    assert [lvl for _, lvl in deg.steps] == [1, 2, 3, 2, 1, 0] and len(ORDER) == 3
    off = Degradation(enabled=False)
    assert [off.update(busy, float(t)) for t in range(5)] == [0] * 5


def test_asr_step_of_every_stream_follows_the_degradation():
    from models.asr import ASRWorker, StreamingConfig

    worker = ASRWorker(engine=_NullEngine(), config=StreamingConfig(int8=False), autostart=False)
    first = worker.open("a")
    worker.set_step_s(0.3)
    second = worker.open("b")
    assert first.config.step_s == second.config.step_s == 0.3
    worker.set_step_s(None)
    assert first.config.step_s == worker.open("c").config.step_s == 0.15
    assert first.config.guard_s == worker.config.guard_s  # only the step changed
    assert not hasattr(first, "asr")  # the stream holds its config; the recogniser is the lane's


class _NullEngine:
    """An engine that hears nothing (the worker's scheduling is what is tested, not recognition)."""

    name = "null"

    def transcribe(self, audio, prefix=(), prompt="", draft=(), expect_words=False):  # noqa: ANN001, ANN201
        return []


def test_spawned_server_admits_every_peer_unless_the_run_checks_admission():
    parse = cli.build_parser().parse_args
    assert cli.spawn_args(parse(["--spawn-server"])) == ["--admission", "fixed"]
    assert cli.spawn_args(parse(["--spawn-server", "--allow-refusals"])) == []
    assert cli.spawn_args(parse(["--spawn-server", "--server-arg=--admission=measured"])) == [
        "--admission=measured"]


def test_refused_peers_fail_a_round_unless_refusals_are_allowed():
    words = [[t, t + 0.3, t + 0.5, t + 0.7, "w", "text"] for t in np.arange(0.0, 10.0, 0.5)]
    admitted = {"index": 0, "connected": True, "run_s": 20.0, "words": words, "level3": {"checks": 10, "ok": 10}}
    refused = {"index": 1, "connected": False, "error": "WHIP 503: server full",
               "refused": {"status": 503, "retry_after": "5"}}
    silent = {"index": 2, "connected": False, "error": "WHIP 503: server full", "refused": {"status": 503,
                                                                                           "retry_after": None}}
    strict = verdict.aggregate([admitted, refused])
    assert not strict["bounds"]["ok"] and strict["refused"] == [1]
    lenient = verdict.aggregate([admitted, refused], allow_refusals=True)
    assert lenient["bounds"]["ok"] and lenient["failed"] == []
    assert not verdict.aggregate([admitted, silent], allow_refusals=True)["bounds"]["ok"]  # 503 needs Retry-After
    assert not verdict.aggregate([refused], allow_refusals=True)["bounds"]["ok"]  # someone must be admitted
    # The load generator's own cost: CPU after the clips were built, per second a peer streamed.
    assert verdict.client_cpu_per_peer([admitted, refused], {0: 5.0}, {0: 4.0}) == 0.05


def test_slow_words_alone_count_as_overload():
    from app.live.degrade import OverloadSignal
    from app.live.server_metrics import ServerMetrics

    metrics = ServerMetrics()
    metrics.observe_stage("token_final", 0.2)
    metrics.observe_stage("au", 3.0)  # not a word
    metrics.observe_stage("token_interim", 2.5)  # one revised interim of an old word: not overload
    metrics.observe_stage("token_final", 0.3)
    assert metrics.word_latency_median() == 0.3
    assert not OverloadSignal(0.5, 2.0, 0.0, metrics.word_latency_median()).overloaded()
    for _ in range(4):
        metrics.observe_stage("token_final", 1.1)  # most words late
    assert metrics.word_latency_median() == 1.1
    assert OverloadSignal(0.5, 2.0, 0.0, metrics.word_latency_median()).overloaded()
    assert not OverloadSignal(0.5, 2.0, 0.0, 0.2).overloaded()


def test_late_finals_count_as_overload_before_the_median_word_does():
    from app.live.degrade import OverloadSignal
    from app.live.server_metrics import ServerMetrics

    metrics = ServerMetrics()
    for _ in range(8):
        metrics.observe_stage("token_interim", 0.2)
        metrics.observe_stage("token_final", 0.5)
    assert metrics.final_latency_high() == 0.5
    for _ in range(3):
        metrics.observe_stage("token_final", 1.2)  # a burst of finals late enough to put captions at risk
    assert metrics.word_latency_median() < 0.8 and metrics.final_latency_high() == 1.2
    calm = OverloadSignal(0.5, 2.0, 0.0, metrics.word_latency_median(), 0.5, 0.9)
    late = OverloadSignal(0.5, 2.0, 0.0, metrics.word_latency_median(), metrics.final_latency_high(), 0.9)
    assert not calm.overloaded() and late.overloaded()
    assert calm.why() == [] and late.why() == ["finals p90 1.20 s > 0.90 s"]  # what the step's log line says
    # the limit follows the output delay: a server that delays its video longer has more room
    assert not OverloadSignal(0.5, 2.0, 0.0, 0.2, 1.2, 0.6 * 2.5).overloaded()


def test_late_words_with_a_core_to_spare_are_not_overload():
    """Late finals on a machine with a core idle are the recogniser's own waits (an utterance's end, an unsure
    word's guard): shedding work would only make decodes rarer. With no core to spare they count as before;
    an ASR backlog and a full CPU share count whatever the machine does."""
    from app.live.degrade import OverloadSignal

    late = dict(cpu_cores=0.8, usable_cores=2.0, asr_backlog_s=0.0, word_latency_s=0.9, final_latency_s=1.3,
                final_limit_s=0.9)
    assert OverloadSignal(**late, spare_cores=0.2).why() == ["median word latency 0.90 s", "finals p90 1.30 s > 0.90 s"]
    assert not OverloadSignal(**late, spare_cores=0.9).overloaded()
    assert OverloadSignal(**{**late, "asr_backlog_s": 0.6}, spare_cores=0.9).why() == ["ASR backlog 0.60 s"]


def test_spare_cores_see_another_process_taking_the_cpu():
    """The spare-core reading counts every process's work on this process's CPUs, not only its own."""
    import multiprocessing
    import os
    import time

    from app.live.cpu_account import SpareCores

    cpus = sorted(os.sched_getaffinity(0))
    spare = SpareCores()
    assert spare.sample(0.0, float(len(cpus))) is None  # the first call only starts the interval
    time.sleep(0.5)
    quiet = spare.sample(0.0, float(len(cpus)))
    ctx = multiprocessing.get_context("spawn")
    hogs = [ctx.Process(target=_spin, args=(1.5,)) for _ in cpus]
    for h in hogs:
        h.start()
    time.sleep(0.5)  # (started)
    spare.sample(0.0, float(len(cpus)))
    time.sleep(0.8)
    busy = spare.sample(0.0, float(len(cpus)))
    for h in hogs:
        h.join()
    assert quiet is not None and busy is not None
    assert busy < 0.35 < quiet, (quiet, busy)
    time.sleep(0.3)
    capped = spare.sample(1.9, 2.0)  # a quota (or this process's own work) caps it
    assert capped is not None and capped <= 0.1 + 1e-9


def _spin(seconds: float) -> None:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_shed_steps_are_a_floor_the_overload_order_starts_above():
    from app.live.degrade import Degradation, OverloadSignal

    calm = OverloadSignal(cpu_cores=1.0, usable_cores=2.0, asr_backlog_s=0.05)
    busy = OverloadSignal(cpu_cores=1.97, usable_cores=2.0, asr_backlog_s=0.05)
    deg = Degradation(enter_s=1.0, leave_s=5.0, floor=1)
    assert deg.level == 1 and deg.effects.au_fps == 8.0 and deg.effects.output_scale == 1.0
    assert not deg.overloaded  # the floor is a choice, not an overload
    assert [deg.update(busy, float(t)) for t in range(4)] == [1, 2, 3, 3]
    assert deg.overloaded
    assert [deg.update(calm, float(t)) for t in range(4, 20)][-1] == 1  # gives steps back down to the floor only
    assert deg.reset(21.0) == 1 and not deg.overloaded
    off = Degradation(enabled=False, floor=3)  # degrade off (bench/serve.py --no-degrade), --shed 3: the floor holds
    assert [off.update(busy, float(t)) for t in range(3)] == [3, 3, 3] and off.effects.asr_step_s == 0.3
    with pytest.raises(ValueError):
        Degradation(floor=4)


def test_a_server_that_sheds_always_gives_its_asr_the_longer_step_and_admits_by_its_capacity():
    from app import cli as app_cli
    from app.live.admission import Admission
    from app.live.server_metrics import ServerMetrics
    from models.asr import ASRWorker, StreamingConfig

    assert app_cli.server_config(app_cli.build_parser().parse_args(["serve", "--shed", "3"])).shed_steps == 3
    worker = ASRWorker(engine=_NullEngine(), config=StreamingConfig(int8=False), autostart=False)
    admission = Admission(ServerConfig.in_process(ui=False, stages=(), admission="measured", shed_steps=3,
                                                  degrade=True), ServerMetrics())
    admission.measure(0, worker)  # the first measurement, before any session
    assert worker.open("a").config.step_s == 0.3
    assert admission.limit(1) == admission.current.sessions  # shedding by choice does not close the door
    assert admission.readiness()["degradation"] == {"level": 3, "steps": ["au_rate", "video_quality", "asr_step"],
                                                     "order": ["au_rate", "video_quality", "asr_step"],
                                                     "floor": 3}


def test_asr_worker_reports_how_long_its_oldest_queued_audio_waited():
    from alignment.types import AudioChunk
    from models.asr import ASRWorker, StreamingConfig

    worker = ASRWorker(engine=_NullEngine(), config=StreamingConfig(int8=False), autostart=False)  # no lane runs
    assert worker.stats().oldest_wait_s == 0.0
    stream = worker.open("a")
    stream.push(AudioChunk(0.0, np.zeros(320, np.float32)))
    time.sleep(0.35)
    stream.push(AudioChunk(0.02, np.zeros(320, np.float32)))
    assert 0.3 <= worker.stats().oldest_wait_s < 5.0  # the first chunk's wait, not the last one's
