"""Benchmark: the spoken answer at the client — voice-to-voice, barge-in, lip-sync, and whether it says its text.

Targets (issue 35, "Must show"), each printed with PASS/FAIL:
  * voice-to-voice, 1 session, built-in responder: p50 <= 550 ms and p95 <= 850 ms over >= 20 turns;
  * voice-to-voice with an OpenAI-compatible stand-in LLM at 80 ms TTFT: p50 <= 700 ms;
  * barge-in over >= 50 barge-ins, clean network, echo path on: the answer's audio stops at the peer within
    250 ms of the user's onset (p50) and <= 450 ms (p99); false interruptions <= 5 % of answers;
  * lip-sync offset <= 40 ms, p95 over answers;
  * each answer's audio says its text: Whisper tiny.en's WER on the received answer audio within 2 points
    of its WER on the same text synthesized offline (festival slt_hts, the answers' voice).

Everything is measured at an aiortc peer (``app.loadtest.peer.VoicePeer``) over loopback against a spawned
``synchrony serve``. The peer speaks festival kal_diphone sentences (not the answers' voice) through a
scripted microphone, so each utterance's true onset and end of speech are known: where its sound starts and
stops, kept within festival's own first and last phone (kal's pause before a /w/ holds 200 ms of rumble at
-39 dBFS, which by level alone read as the onset). Voice-to-voice is the end of speech to
the first received answer packet above -40 dBFS (arrival wall time). For barge-ins the peer starts its
next sentence 0.5–1.5 s (seeded) into an answer and times how long the answer's audio still arrives.
With the echo path on (default; in the barge-in phase, and in the turns with ``--echo-turns``), the
received answer is played back into the peer's microphone through a seeded room response (30–250 ms
taps); answers ended as ``barge_in`` with no peer speech over them are false interruptions, and final
user words in none of the peer's utterances are words heard from the echo.
Lip-sync is the mouth opening read from the received avatar frames' pixels against the received audio's
envelope, both on the peer's clock through the RTCP sender reports (``app.loadtest.answers``); the same
measure on the avatar drawn offline at zero shift (``models.avatar``, festival's phone times) is its
bias, printed beside, and the target is judged on the received offset minus that bias.

Bounded: at most ``--turns`` + ``--barge-ins`` + ``--llm-turns`` utterances, each wait with a deadline,
and ``--max-minutes`` for the whole run. Loopback only.

    PYTHONPATH=$PWD flock /tmp/heavy.lock .venv/bin/python bench/voice.py [--turns 20] [--barge-ins 50]
        [--llm-turns 10] [--no-echo] [--mic-noise-dbfs -70] [--seed 0] [--server-arg=--flag]
        [--trace DIR [--trace-listen]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from alignment.types import SAMPLE_RATE  # noqa: E402
from app.loadtest import answers as ans  # noqa: E402
from app.loadtest.voicepeer import answer_audio, answers_of, echo_tokens, heard_words  # noqa: E402
from models.bargein import TRACE_ENV, TRACE_LISTEN_ENV  # noqa: E402

V2V_P50_MS, V2V_P95_MS, LLM_V2V_P50_MS = 550.0, 850.0, 700.0
STOP_P50_MS, STOP_P99_MS, FALSE_RATE = 250.0, 450.0, 0.05
LIP_P95_MS, WER_POINTS = 40.0, 2.0
PEER_VOICE = "kal_diphone"
ANSWER_VOICE = "slt_hts"

#: What the user says: short requests a person might make of an assistant.
SENTENCES = (
    "what is the weather like today",
    "can you tell me a short story",
    "please remind me to buy some milk",
    "how long does it take to boil an egg",
    "what time is it in tokyo right now",
    "could you read me the news headlines",
    "i would like to book a table for two",
    "tell me something interesting about whales",
    "how far away is the moon",
    "what should i cook for dinner tonight",
    "play some quiet music please",
    "when does the next train leave",
)


@dataclass(frozen=True)
class Said:
    text: str
    samples: np.ndarray
    phones: tuple[float, float] | None = None  # the synthesizer's first phone start and last phone end (s)


def voices(texts: tuple[str, ...]) -> list[Said]:
    from app.loadtest.festival import synthesize_festival

    spoken = [synthesize_festival(t, PEER_VOICE) for t in texts]
    return [Said(t, s.samples, s.phones) for t, s in zip(texts, spoken, strict=True)]


def camera(n: int = 16, size: tuple[int, int] = (320, 180)) -> list[np.ndarray]:
    """A still talking face (mouth closed): the camera the server's face analysis sees."""
    from app.talking_face import talking_face_frames

    return talking_face_frames(np.zeros(n), size)


# --- one live run ------------------------------------------------------------------------------------


class Run:
    """One spawned server and one peer; ``turns`` and ``barge_ins`` drive the conversation."""

    def __init__(self, args: argparse.Namespace, server_args: list[str], name: str) -> None:
        self.args, self.server_args, self.name = args, server_args, name
        self.deadline = 0.0
        self.peer: Any = None
        self.echo: ans.EchoPath | None = None
        self.phase_of: dict[int, str] = {}  # utterance index in peer.said → "turn" | "barge"

    async def __aenter__(self) -> Run:
        from app.loadtest.peer import VoicePeer
        from app.loadtest.spawn import SpawnedServer

        log = Path(tempfile.mkdtemp(prefix=f"voice-{self.name}-")) / "server.log"
        self.server = SpawnedServer(2, log, self.server_args)
        print(f"[{self.name}] server on 127.0.0.1:{self.server.port} (log {log}) ...", flush=True)
        await asyncio.to_thread(self.server.wait_ready)
        self.echo = None if self.args.no_echo else ans.EchoPath(ans.RoomResponse.seeded(self.args.seed))
        self.peer = VoicePeer(self.server.url, camera(), fps=16.0, echo=self.echo, decode_camera=False,
                              mic_noise_dbfs=self.args.mic_noise_dbfs)
        await self.peer.connect(timeout=20)
        await asyncio.sleep(1.5)  # the session settles (first frames, face, silence for the VAD)
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.peer is not None:
                await self.peer.close()
        finally:
            await asyncio.to_thread(self.server.stop)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def _answer_after(self, onset_s: float) -> Any:
        """The first answer whose ``answer_start`` arrived after peer time ``onset_s``."""
        t0 = self.peer.t0_wall
        for rec in answers_of(self.peer.events):
            if rec.start_wall - t0 > onset_s:
                return rec
        return None

    async def _until(self, cond: Any, timeout: float) -> Any:
        end = time.monotonic() + min(timeout, max(self.left(), 0.0))
        while time.monotonic() < end:
            got = cond()
            if got:
                return got
            await asyncio.sleep(0.02)
        return None

    def _quiet_since(self, s: float) -> bool:
        """No loud answer audio has arrived for ``s`` seconds."""
        last = next((p.wall for p in reversed(self.peer.answer.packets) if p.loud), None)
        return last is None or time.monotonic() - last >= s

    async def turns(self, sentences: list[Said], n: int) -> int:
        """Say ``n`` sentences, each after the previous answer finished; returns how many were answered.

        The echo path is off here unless ``--echo-turns``: voice-to-voice is a figure of the answer, and
        an answer's echo heard as speech (the server's echo rejection is judged in the barge-in phase)
        would move the turn's end."""
        self.peer.mic.echo = self.echo if self.args.echo_turns else None
        answered = 0
        for i in range(n):
            if self.left() <= 0:
                break
            s = sentences[i % len(sentences)]
            utt = self.peer.say(s.samples, s.text, phones=s.phones)
            self.phase_of[len(self.peer.said) - 1] = "turn"
            await asyncio.sleep(max(utt.end - self.peer.mic.now_s, 0.0))
            rec = await self._until(lambda u=utt: self._answer_after(u.onset), 8.0)
            if rec is None:
                print(f"[{self.name}] turn {i + 1}: no answer within 8 s", flush=True)
                continue
            answered += 1
            await self._until(lambda r=rec: next((x for x in answers_of(self.peer.events)
                                                  if x.answer == r.answer and x.end_wall), None), 30.0)
            await self._until(lambda: self._quiet_since(0.6), 10.0)
            await asyncio.sleep(0.3)
        return answered

    async def barge_ins(self, sentences: list[Said], n: int, rng: np.random.Generator) -> int:
        """Speak; 0.5–1.5 s into the answer, speak again over it; repeat. Returns barge-ins made.
        The echo path is on (unless ``--no-echo``): the answer comes back into the microphone meanwhile."""
        self.peer.mic.echo = self.echo
        made = 0
        s = sentences[0]
        utt = self.peer.say(s.samples, s.text, phones=s.phones)
        self.phase_of[len(self.peer.said) - 1] = "barge"
        k = 1
        while made < n and self.left() > 0:
            t0 = self.peer.t0_wall
            first = await self._until(
                lambda u=utt, t0=t0: ans.first_loud(self.peer.answer.packets, t0 + u.end), 8.0)
            if first is None:
                print(f"[{self.name}] no answer to {utt.text!r} within 8 s; speaking again", flush=True)
                await self._until(lambda: self._quiet_since(0.6), 10.0)
            else:
                await asyncio.sleep(float(rng.uniform(0.5, 1.5)))
                if self._quiet_since(0.15):  # the answer already ended: not a barge-in; go on
                    await asyncio.sleep(0.3)
                else:
                    made += 1
            s = sentences[k % len(sentences)]
            k += 1
            utt = self.peer.say(s.samples, s.text, barge_in=first is not None, phones=s.phones)
            self.phase_of[len(self.peer.said) - 1] = "barge"
        await asyncio.sleep(max(utt.end - self.peer.mic.now_s, 0.0))
        await self._until(lambda: self._quiet_since(1.0), 15.0)
        return made


# --- analysis ----------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float | None:
    return ans.quantile(values, q)


def fmt(x: float | None, unit: str = " ms") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}{unit}"


def check(ok: bool | None, what: str) -> bool:
    print(f"{'PASS' if ok else 'FAIL'}: {what}")
    return bool(ok)


def spoken_form(text: str) -> list[str]:
    """The words a synthesizer reads ``text`` as (numbers spelled out), as Whisper would be scored on."""
    from models.tts import normalize_text

    return [tok.strip(",.;:!?") for w in normalize_text(text) for tok in w.spoken if tok.strip(",.;:!?")]


def wer_pair(texts: list[tuple[str, np.ndarray]]) -> tuple[tuple[int, int], tuple[int, int]]:
    """(edits, words) of Whisper on the received audio and on the same text synthesized offline: the
    answer's text cut into phrases (``models.tts.PhraseChunker``) and spoken by ``FestivalTTS``
    (slt_hts) at the middle of the speaking-rate range, as the server speaks it but without the trip."""
    from models.asr import transcribe_words
    from models.tts import FestivalTTS, PhraseChunker
    from models.tts.rate import FASTEST_WPM, SLOWEST_WPM

    async def offline(tts: FestivalTTS, text: str) -> np.ndarray:
        chunker = PhraseChunker()
        phrases = chunker.feed(text) + chunker.flush()
        parts = []
        for ph in phrases:
            spoken = await tts.synthesize(ph, (SLOWEST_WPM + FASTEST_WPM) / 2)
            pcm = np.asarray(spoken.audio, np.float32)
            if spoken.sample_rate != SAMPLE_RATE:
                from alignment.espeak import resample

                pcm = resample(pcm, spoken.sample_rate, SAMPLE_RATE)
            parts += [pcm, np.zeros(SAMPLE_RATE // 10, np.float32)]
        return np.concatenate(parts) if parts else np.zeros(0, np.float32)

    async def all_offline() -> list[np.ndarray]:
        tts = FestivalTTS(processes=1)
        try:
            return [await offline(tts, text) for text, _ in texts]
        finally:
            await tts.aclose()

    synthesized = asyncio.run(all_offline())
    rx, off = [0, 0], [0, 0]
    for (text, audio), offline_audio in zip(texts, synthesized, strict=True):
        ref = spoken_form(text)
        if not ref or audio.size < SAMPLE_RATE // 4 or offline_audio.size < SAMPLE_RATE // 4:
            continue
        for acc, x in ((rx, audio), (off, offline_audio)):
            e, n = ans.wer(ref, [w.text for w in transcribe_words(x)])
            acc[0] += e
            acc[1] += n
    return (rx[0], rx[1]), (off[0], off[1])


def lip_bias(texts: list[str], fps: float = 16.0) -> list[float]:
    """The pixel measure's offset on the avatar drawn offline at zero shift (its own bias): festival slt_hts
    phone times → ``models.visemes.mouth_at`` → ``models.avatar.AvatarRenderer`` → the peer's measure."""
    try:
        from models.avatar import AvatarRenderer
        from models.tts import FestivalTTS
        from models.visemes import mouth_at
    except ImportError as exc:
        print(f"(lip-sync bias not measured: {exc})")
        return []

    async def measure() -> list[float]:
        out = []
        tts = FestivalTTS(processes=1)
        renderer = AvatarRenderer()
        try:
            for text in texts:
                phrase = await tts.synthesize(text, 165.0)
                audio, rate = np.asarray(phrase.audio, np.float32), phrase.sample_rate
                t = np.arange(int(len(audio) / rate * fps)) / fps
                frames = [renderer.draw(mouth_at(phrase.phones, ti)) for ti in t]
                lumas = [ans.luma(f) for f in frames]
                box = ans.mouth_box(lumas)
                mouth = np.array([ans.mouth_opening(y, box) for y in lumas])
                env = ans.envelope(audio, rate)
                lip = ans.lip_sync_offset(np.arange(len(env)) * 0.01 + 0.005, env, t, mouth)
                if lip is not None:
                    out.append(lip.offset_ms)
        finally:
            await tts.aclose()
        return out

    try:
        return asyncio.run(measure())
    except Exception as exc:  # noqa: BLE001 - the bias is a side figure; say why it is missing
        print(f"(lip-sync bias not measured: {type(exc).__name__}: {exc})")
        return []


async def live(args: argparse.Namespace) -> dict[str, Any]:
    from app.loadtest.llm_standin import StandInLLM

    rng = np.random.default_rng(args.seed)
    said = await asyncio.to_thread(voices, SENTENCES)
    out: dict[str, Any] = {}
    stop_at = time.monotonic() + args.max_minutes * 60
    if args.trace:
        os.environ[TRACE_ENV] = str(args.trace)  # the built-in run's server only
        if args.trace_listen:
            os.environ[TRACE_LISTEN_ENV] = "1"
    async with Run(args, list(args.server_arg), "built-in") as run:
        os.environ.pop(TRACE_ENV, None)
        os.environ.pop(TRACE_LISTEN_ENV, None)
        run.deadline = stop_at - (90 if args.llm_turns else 0)
        out["answered"] = await run.turns(said, args.turns)
        out["barge_ins_made"] = await run.barge_ins(said, args.barge_ins, rng) if args.barge_ins else 0
        out["builtin"] = (run.peer.figures(), run.peer, dict(run.phase_of))
        if args.trace:
            write_truth(args.trace, run.peer.said, said)
    if args.llm_turns and time.monotonic() < stop_at:
        llm = await StandInLLM(ttft_s=0.080).start()
        try:
            async with Run(args, ["--responder", "openai", "--llm-url", llm.base_url, *args.server_arg],
                           "llm-80ms") as run:
                run.deadline = stop_at
                out["llm_answered"] = await run.turns(said, args.llm_turns)
                out["llm"] = (run.peer.figures(), run.peer, dict(run.phase_of))
        finally:
            await llm.stop()
    return out


def write_truth(folder: Path, utterances: list[Any], said: list[Said]) -> None:
    """What the peer said (peer clock): ``bench/barge_in.py --trace`` places it on the server's clock by
    matching this voice-only track against the traced microphone."""
    from app.loadtest.answers import speech_span

    audio = {s.text: s.samples for s in said}
    end = max((u.end for u in utterances), default=0.0)
    voice = np.zeros(int((end + 1.0) * SAMPLE_RATE), np.float32)
    for u in utterances:
        x = audio[u.text]
        span = speech_span(x, SAMPLE_RATE)
        x = x[span[0]:span[1]] if span else x
        i = int(round((u.onset if u.sent_at is None else u.sent_at) * SAMPLE_RATE))
        voice[i:i + len(x)] += x[: max(len(voice) - i, 0)]
    np.savez_compressed(Path(folder) / "truth.npz", onset=[u.onset for u in utterances],
                        end=[u.end for u in utterances], barge_in=[u.barge_in for u in utterances], voice=voice)


def report(args: argparse.Namespace, out: dict[str, Any]) -> int:
    figs, peer, phase_of = out["builtin"]
    said = peer.said
    if args.dump:
        Path(args.dump).write_text(json.dumps({"answers": figs, "said": [vars(u) for u in said]}, indent=1))
    turn_figs = [f for f in figs if phase_of.get(f.get("utterance_index", -1)) == "turn"]
    v2v = [f["voice_to_voice_ms"] for f in turn_figs if f["voice_to_voice_ms"] is not None]
    stops = [f["stop_ms"] for f in figs if f["stop_ms"] is not None]
    barged = [f for f in figs if f["barge_in"]]
    false = [f for f in figs if f["false_interruption"]]
    lips = [f["lip_sync_ms"] for f in figs if f["lip_sync_ms"] is not None]
    audible = [f for f in figs if f["audible"]]
    server_v2v = [f["server_voice_latency_ms"] for f in turn_figs if f["server_voice_latency_ms"] is not None]
    heard_echo = echo_tokens(peer.events, said)
    over_heard, over_said = heard_words(peer.events, said)
    warnings = [e.message for e in peer.events if e.type == "warning"]
    print(f"\nbuilt-in responder, 1 session, echo path {'off' if args.no_echo else 'on'} "
          f"({'turns and barge-ins' if args.echo_turns else 'barge-in phase'}) "
          f"(room taps ms:gain {_taps(args)}); mic noise floor "
          f"{'none (zeros)' if args.mic_noise_dbfs is None else f'{args.mic_noise_dbfs:g} dBFS'}; "
          f"load average {[round(x, 2) for x in os.getloadavg()]}")
    orphans = sum(f.get("utterance") is None for f in figs)
    print(f"  answers {len(figs)} ({len(audible)} audible; {orphans} answering nothing the peer said, e.g. its "
          f"echo heard as speech), turns answered {out['answered']} of {args.turns}, "
          f"barge-ins made {out['barge_ins_made']} of {args.barge_ins}, warnings {len(warnings)}")
    print(f"  voice-to-voice (true end of speech → first answer packet ≥ -40 dBFS): n={len(v2v)} "
          f"p50 {fmt(pct(v2v, .5))}, p95 {fmt(pct(v2v, .95))}, max {fmt(max(v2v) if v2v else None)}; "
          f"server-side (VAD end → first audio handed to the track) p50 {fmt(pct(server_v2v, .5))}")
    print(f"  barge-in stop (onset → answer audio silent at the peer): n={len(stops)} of {len(barged)} "
          f"p50 {fmt(pct(stops, .5))}, p99 {fmt(pct(stops, .99))}, max {fmt(max(stops) if stops else None)}; "
          f"answers ended by barge_in: {sum(f['reason'] == 'barge_in' for f in figs)}; fired before the onset "
          f"(on sound before the first phone): {sum(f['fired_ms'] is not None and f['fired_ms'] < 0 for f in barged)}")
    both = [(f["fired_ms"], f["stop_ms"]) for f in figs if f["fired_ms"] is not None and f["stop_ms"] is not None]
    fired, tail = [a for a, _ in both], [b - a for a, b in both]
    print(f"    breakdown over {len(both)}: onset → detector fired (response_end at the peer) "
          f"p50 {fmt(pct(fired, .5))}, "
          f"p90 {fmt(pct(fired, .9))}, p99 {fmt(pct(fired, .99))}; fired → answer audio silent at the peer p50 "
          f"{fmt(pct(tail, .5))}, p90 {fmt(pct(tail, .9))}, max {fmt(max(tail) if tail else None)}")
    rate = len(false) / len(figs) if figs else None
    print(f"  false interruptions: {len(false)} of {len(figs)} answers "
          f"({fmt(None if rate is None else 100 * rate, ' %')}); final user words heard in none of the peer's "
          f"utterances (echo): {heard_echo}; words said over an answer finalised: {over_heard} of {over_said}")
    bias = lip_bias([f.get("text") or "" for f in _texts(peer)][:8] or list(SENTENCES[:4])) if lips else []
    b = float(np.median(bias)) if bias else 0.0
    corrected = [x - b for x in lips]
    print(f"  lip-sync (received mouth pixels vs received audio envelope, sender-report clock): n={len(lips)} "
          f"raw p50 {fmt(pct(lips, .5))}, |raw| p95 {fmt(pct([abs(x) for x in lips], .95))}; measure's own "
          f"bias offline at zero shift {fmt(b if bias else None)} (n={len(bias)}); |received − bias| p95 "
          f"{fmt(pct([abs(x) for x in corrected], .95))}")
    texts = [(t, a) for t, a in _answer_audio(peer) if t]
    (re_, rn), (oe, on) = wer_pair(texts[: args.wer_answers])
    wer_rx = 100.0 * re_ / rn if rn else None
    wer_off = 100.0 * oe / on if on else None
    print(f"  Whisper tiny.en WER over {min(len(texts), args.wer_answers)} finished answers: received "
          f"{fmt(wer_rx, ' %')} ({re_}/{rn}), same text offline (festival {ANSWER_VOICE}) {fmt(wer_off, ' %')} "
          f"({oe}/{on})")
    ok = True
    print()
    ok &= check(len(v2v) >= 20 and pct(v2v, .5) <= V2V_P50_MS and pct(v2v, .95) <= V2V_P95_MS,
                f"voice-to-voice built-in p50 {fmt(pct(v2v, .5))} <= {V2V_P50_MS:.0f} ms and p95 "
                f"{fmt(pct(v2v, .95))} <= {V2V_P95_MS:.0f} ms over >= 20 turns (n={len(v2v)})")
    if "llm" in out:
        lfigs, lpeer, lphase = out["llm"]
        lv = [f["voice_to_voice_ms"] for f in lfigs if f["voice_to_voice_ms"] is not None]
        print(f"  stand-in LLM (80 ms TTFT): n={len(lv)} p50 {fmt(pct(lv, .5))}, p95 {fmt(pct(lv, .95))}")
        ok &= check(bool(lv) and pct(lv, .5) <= LLM_V2V_P50_MS,
                    f"voice-to-voice with the 80 ms-TTFT stand-in LLM p50 {fmt(pct(lv, .5))} "
                    f"<= {LLM_V2V_P50_MS:.0f} ms")
    ok &= check(len(stops) >= 50 and pct(stops, .5) <= STOP_P50_MS and pct(stops, .99) <= STOP_P99_MS,
                f"barge-in stop p50 {fmt(pct(stops, .5))} <= {STOP_P50_MS:.0f} ms and p99 {fmt(pct(stops, .99))} "
                f"<= {STOP_P99_MS:.0f} ms over >= 50 barge-ins (n={len(stops)})")
    ok &= check(rate is not None and rate <= FALSE_RATE,
                f"false interruptions {len(false)}/{len(figs)} <= {FALSE_RATE:.0%} of answers (echo path on: "
                f"{not args.no_echo})")
    ok &= check(bool(corrected) and pct([abs(x) for x in corrected], .95) <= LIP_P95_MS,
                f"lip-sync |offset| p95 {fmt(pct([abs(x) for x in corrected], .95))} <= {LIP_P95_MS:.0f} ms")
    ok &= check(wer_rx is not None and wer_off is not None and wer_rx - wer_off <= WER_POINTS,
                f"received answer WER {fmt(wer_rx, ' %')} within {WER_POINTS:.0f} points of offline "
                f"{fmt(wer_off, ' %')}")
    return 0 if ok else 1


def _taps(args: argparse.Namespace) -> str:
    if args.no_echo:
        return "-"
    return " ".join(f"{d * 1000:.0f}:{g:.2f}" for d, g in ans.RoomResponse.seeded(args.seed).taps)


def _texts(peer: Any) -> list[dict[str, Any]]:
    return [{"text": r.text} for r in answers_of(peer.events) if r.reason == "done" and r.text]


def _answer_audio(peer: Any) -> list[tuple[str, np.ndarray]]:
    """Each finished answer's spoken text and the 16 kHz audio received for it."""
    recs = answers_of(peer.events)
    out = []
    for i, rec in enumerate(recs):
        if rec.reason != "done" or not rec.text:
            continue
        hi = recs[i + 1].start_wall - 0.3 if i + 1 < len(recs) else math.inf
        audio = answer_audio(peer.answer, rec.start_wall - 0.3, hi)
        loud = np.flatnonzero(np.abs(audio) > 1e-3)
        if loud.size:
            audio = audio[max(int(loud[0]) - 1600, 0) : int(loud[-1]) + 1600]
        out.append((rec.text, audio))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=20, help="turns for voice-to-voice (built-in responder)")
    ap.add_argument("--barge-ins", type=int, default=50, help="barge-ins to make")
    ap.add_argument("--llm-turns", type=int, default=10, help="turns with the 80 ms-TTFT stand-in LLM (0: skip)")
    ap.add_argument("--wer-answers", type=int, default=20, help="finished answers transcribed for the WER check")
    ap.add_argument("--dump", default=None, help="write every answer's figures and what the peer said (JSON)")
    ap.add_argument("--no-echo", action="store_true", help="no echo path into the peer's microphone")
    ap.add_argument("--mic-noise-dbfs", type=float, default=None,
                    help="a noise floor in the peer's microphone (RMS dBFS; a real mic has one), none by default")
    ap.add_argument("--echo-turns", action="store_true", help="the echo path on in the voice-to-voice turns too")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-minutes", type=float, default=15.0, help="stop the live part after this long")
    ap.add_argument("--server-arg", action="append", default=[], help="extra `synchrony serve` argument")
    ap.add_argument("--trace", type=Path, default=None,
                    help="folder: the server's barge-in detector records its inputs there, and the peer its truth "
                         "(replay with bench/barge_in.py --trace)")
    ap.add_argument("--trace-listen", action="store_true",
                    help="with --trace: the server records but never stops an answer (the barge-in figures then "
                         "come from the replay)")
    args = ap.parse_args()
    if not (1 <= args.turns <= 200 and 0 <= args.barge_ins <= 300 and 0 <= args.llm_turns <= 100
            and 0.5 <= args.max_minutes <= 60):
        ap.error("--turns 1..200, --barge-ins 0..300, --llm-turns 0..100, --max-minutes 0.5..60")
    t = time.monotonic()
    print("command: " + " ".join(["bench/voice.py", *sys.argv[1:]]), flush=True)
    out = asyncio.run(live(args))
    code = report(args, out)
    print(f"({time.monotonic() - t:.0f} s)")
    return code


if __name__ == "__main__":
    sys.exit(main())
