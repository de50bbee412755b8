"""Festival speech for the answers: a small pool of resident festival processes shared by all sessions.

Loading a voice costs more than speaking a phrase, so each process stays up and takes one phrase at a
time. They are ``festival --pipe`` children fed Scheme on stdin, not ``festival --server``: no TCP
port to guard (its protocol trusts any local client), a dead child shows at once as end-of-file, and
the pool serialises requests per process. Festival buffers stdout, so replies go to stderr.

Times come from the utterance: each token's Word daughters reach their segments through SylStructure,
and the Segment relation gives every phone's end. The HTS voice ignores ``Duration_Stretch``, so its
rate is the engine's speed ``-r``; diphone voices take ``Duration_Stretch``; both from the voice's
:data:`NATURAL_WPM`. Past a request's deadline its process is killed and restarted, as is any process
found dead (docs/SPEECH.md).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import queue
import select
import shutil
import subprocess
import tempfile
import threading
import time
import wave
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from alignment.espeak import resample
from alignment.types import SAMPLE_RATE, SpokenPhone, SpokenPhrase
from models.tts.base import ANSWER_VOICE, TTSError, check_request, display_words, empty_phrase
from models.tts.normalize import NormalizedWord, bare, normalize_text

log = logging.getLogger(__name__)

#: Short name → festival's voice function. All three ship in Debian (festvox-us-slt-hts,
#: festvox-kallpc16k, festvox-kdlpc16k).
VOICES: dict[str, str] = {
    "slt_hts": "voice_cmu_us_slt_arctic_hts",
    "kal_diphone": "voice_kal_diphone",
    "ked_diphone": "voice_ked_diphone",
}
#: Each voice's own rate at speed 1: spoken words per minute from its first word's onset to its last
#: word's end, over bench/tts.py's answer sentences.
NATURAL_WPM: dict[str, float] = {"slt_hts": 191.0, "kal_diphone": 208.0, "ked_diphone": 209.0}
#: Festival's leading silence is cut to this much (its own is ~165 ms, heard as latency). Not less: with
#: 10 ms the echo canceller locked a delay 0.2 s into answers of a load-test session with no echo at
#: all (GCC-PHAT matched the clip's sync click, in the peer's silence, with the answer's first sound)
#: and ate the user's next words.
LEAD_SILENCE_S = 0.05
_STARTUP_TIMEOUT_S = 20.0

_PRELUDE = """(defvar hts_engine_params nil)
({voice})
(set! synchrony_hts_params hts_engine_params)
(define (synchrony_word w)
  (let ((syl1 (item.relation.daughter1 w 'SylStructure))
        (syln (item.relation.daughtern w 'SylStructure)))
    (if syl1
      (format stderr "W\\t%s\\t%f\\t%f\\n" (item.name w)
        (item.feat (item.daughter1 syl1) "segment_start")
        (item.feat (item.daughtern syln) "end")))))
(define (synchrony_tokens tok)
  (if tok (begin (format stderr "T\\t%s\\n" (item.name tok))
                 (mapcar synchrony_word (item.daughters tok))
                 (synchrony_tokens (item.next tok)))))
(define (synchrony_say id text rate stretch wav)
  (set! hts_engine_params (append synchrony_hts_params (list (list "-r" rate))))
  (Parameter.set 'Duration_Stretch stretch)
  (set! synchrony_utt (utt.synth (eval (list 'Utterance 'Text text))))
  (utt.save.wave synchrony_utt wav 'riff)
  (synchrony_tokens (utt.relation.first synchrony_utt 'Token))
  (mapcar (lambda (s) (format stderr "S\\t%s\\t%f\\n" (item.name s) (item.feat s "end")))
          (utt.relation.items synchrony_utt 'Segment))
  (format stderr "OK\\t%s\\n" id))
(format stderr "READY\\n")
"""


def available(voice: str = ANSWER_VOICE) -> bool:
    """True when festival and ``voice`` are installed."""
    if shutil.which("festival") is None or voice not in VOICES:
        return False
    folder = VOICES[voice].removeprefix("voice_")
    return any(Path("/usr/share/festival/voices").glob(f"*/{folder}"))


@dataclass(frozen=True)
class _Reply:
    """One synthesis as festival reported it (times in s from the wave's first sample)."""

    audio: np.ndarray  # float32 at rate
    rate: int
    tokens: tuple[tuple[str, tuple[tuple[float, float], ...]], ...]  # (token, its words' spans)
    segments: tuple[tuple[str, float], ...]  # (phone, end)


class _FestivalProcess:
    """One resident ``festival --pipe``; used by one thread at a time (the pool's)."""

    def __init__(self, voice: str, workdir: Path, index: int) -> None:
        self.voice = voice
        self.wav = workdir / f"festival-{index}.wav"
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_s_dead = 0.0  # CPU of processes of this slot that have ended
        self._buf = b""
        self._ready = False
        self._ids = itertools.count()
        self.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(["festival", "--pipe"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, bufsize=0)
            assert self.proc.stdin is not None
            self.proc.stdin.write(_PRELUDE.format(voice=VOICES[self.voice]).encode())
        except OSError as exc:
            raise TTSError(f"festival could not start: {exc}") from exc
        self._buf, self._ready = b"", False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is None:
            return
        self.cpu_s_dead += process_cpu_s(self.proc.pid)
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait on us
            log.warning("festival %d did not exit after SIGKILL", self.proc.pid)
        for pipe in (self.proc.stdin, self.proc.stderr):
            if pipe is not None:
                pipe.close()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def _lines_until(self, marker: bytes, deadline: float) -> list[str]:
        """stderr lines up to and including the one starting with ``marker``."""
        assert self.proc is not None and self.proc.stderr is not None
        fd = self.proc.stderr.fileno()
        while True:
            lines = self._buf.split(b"\n")
            for i, line in enumerate(lines[:-1]):
                if line.startswith(marker):
                    self._buf = b"\n".join(lines[i + 1 :])
                    return [ln.decode("utf-8", "replace") for ln in lines[: i + 1]]
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            data = os.read(fd, 65536)
            if not data:
                raise EOFError
            self._buf += data

    def speak(self, text: str, rate: float, stretch: float, deadline: float) -> _Reply:
        """Synthesize ``text`` (spoken tokens, single spaces); raises TimeoutError, EOFError, TTSError."""
        assert self.proc is not None and self.proc.stdin is not None
        if not self._ready:
            self._lines_until(b"READY", max(deadline, time.monotonic() + _STARTUP_TIMEOUT_S))
            self._ready = True
        rid = f"r{next(self._ids)}"
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        script = (f'(synchrony_say "{rid}" "{escaped}" {rate:.4f} {stretch:.4f} "{self.wav}")\n'
                  f'(format stderr "DONE\\t{rid}\\n")\n')
        try:
            self.proc.stdin.write(script.encode())
        except (BrokenPipeError, OSError) as exc:
            raise EOFError from exc
        lines = self._lines_until(f"DONE\t{rid}".encode(), deadline)
        if f"OK\t{rid}" not in lines:
            errors = [ln for ln in lines if "ERROR" in ln or "rror" in ln]
            raise TTSError(f"festival failed to speak the phrase: {(errors or ['no reply'])[-1].strip()}")
        tokens: list[tuple[str, list[tuple[float, float]]]] = []
        segments: list[tuple[str, float]] = []
        for line in lines:
            parts = line.split("\t")
            if parts[0] == "T" and len(parts) == 2:
                tokens.append((parts[1], []))
            elif parts[0] == "W" and len(parts) == 4 and tokens:
                tokens[-1][1].append((float(parts[2]), float(parts[3])))
            elif parts[0] == "S" and len(parts) == 3:
                segments.append((parts[1], float(parts[2])))
        with wave.open(str(self.wav), "rb") as fh:
            sr = fh.getframerate()
            pcm = np.frombuffer(fh.readframes(fh.getnframes()), dtype=np.int16)
        return _Reply(pcm.astype(np.float32) / 32768.0, sr,
                      tuple((name, tuple(spans)) for name, spans in tokens), tuple(segments))


def process_cpu_s(pid: int | None) -> float:
    """User + system CPU seconds of a live process (0 when it is gone), from /proc."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class FestivalTTS:
    """Speaks phrases with festival; one instance (a pool of ``processes``) serves every session."""

    name = "festival"

    def __init__(self, voice: str = ANSWER_VOICE, processes: int = 2, timeout_s: float = 5.0, *,
                 sample_rate: int = SAMPLE_RATE, max_waiting: int = 32) -> None:
        if voice not in VOICES:
            raise ValueError(f"unknown festival voice {voice!r}; choose from {sorted(VOICES)}")
        if processes < 1 or timeout_s <= 0:
            raise ValueError("FestivalTTS needs processes >= 1 and timeout_s > 0")
        if not available(voice):
            raise TTSError(f"festival voice {voice!r} is not installed (apt-get install festival festvox-...)")
        self.voice = voice
        self.timeout_s = float(timeout_s)
        self.sample_rate = int(sample_rate)
        self.max_waiting = max_waiting
        self._workdir = Path(tempfile.mkdtemp(prefix="synchrony-festival-"))
        self._procs = [_FestivalProcess(voice, self._workdir, i) for i in range(processes)]
        weakref.finalize(self, _leave_nothing, self._procs, self._workdir)
        self._idle: queue.SimpleQueue[_FestivalProcess] = queue.SimpleQueue()
        for p in self._procs:
            self._idle.put(p)
        self._executor = ThreadPoolExecutor(max_workers=processes, thread_name_prefix="tts-festival")
        self._lock = threading.Lock()
        self._pending = 0
        self._closed = False
        self.restarts = 0

    @property
    def pids(self) -> tuple[int, ...]:
        """The pool's live festival processes (tests kill one; benches read their CPU)."""
        return tuple(p.pid for p in self._procs if p.pid is not None)

    def cpu_seconds(self) -> float:
        """CPU seconds the pool's festival processes have used, ended ones included."""
        return sum(p.cpu_s_dead + process_cpu_s(p.pid) for p in self._procs)

    async def warm(self) -> None:
        """Every process's voice loaded and used once (a server calls this before it is ready)."""
        await asyncio.gather(*(self.synthesize("Ready.", NATURAL_WPM[self.voice]) for _ in self._procs))

    async def synthesize(self, text: str, wpm: float) -> SpokenPhrase:
        wpm = check_request(text, wpm)
        if self._closed:
            raise TTSError("festival is shut down")
        words = normalize_text(text)
        tokens = [s for w in words for s in w.spoken]
        if not tokens:
            return empty_phrase(text, self.sample_rate)
        with self._lock:
            if self._pending >= len(self._procs) + self.max_waiting:
                raise TTSError("festival is busy (too many phrases waiting)")
            self._pending += 1
        try:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._speak_blocking, text, words, tokens, wpm)
        finally:
            with self._lock:
                self._pending -= 1

    def _speak_blocking(self, text: str, words: tuple[NormalizedWord, ...], tokens: list[str],
                        wpm: float) -> SpokenPhrase:
        proc = self._idle.get()  # never waits long: one pool thread per process
        try:
            reply = self._run(proc, " ".join(tokens), wpm)
        finally:
            self._idle.put(proc)
        return self._phrase(text, words, tokens, reply)

    def _run(self, proc: _FestivalProcess, spoken: str, wpm: float) -> _Reply:
        natural = NATURAL_WPM[self.voice]
        for attempt in (1, 2):
            if self._closed:
                raise TTSError("festival is shut down")
            if not proc.alive():
                log.warning("festival process %s had died; starting it again", proc.pid)
                self.restarts += 1
                proc.restart()
            try:
                return proc.speak(spoken, wpm / natural, natural / wpm, time.monotonic() + self.timeout_s)
            except TimeoutError:
                proc.restart()
                self.restarts += 1
                raise TTSError(f"festival timed out after {self.timeout_s:g} s") from None
            except EOFError:
                proc.restart()
                self.restarts += 1
                if attempt == 2:
                    raise TTSError("festival died while speaking") from None
            except (OSError, ValueError, wave.Error) as exc:
                proc.restart()
                self.restarts += 1
                raise TTSError(f"festival's reply could not be read: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _phrase(self, text: str, words: tuple[NormalizedWord, ...], tokens: list[str], reply: _Reply) -> SpokenPhrase:
        if len(reply.tokens) != len(tokens):
            raise TTSError(f"festival read {len(reply.tokens)} tokens for {len(tokens)} "
                           f"({' '.join(t for t, _ in reply.tokens)!r})")
        for (name, _), token in zip(reply.tokens, tokens, strict=True):
            if name.lower() != bare(token).lower():
                raise TTSError(f"festival read the token {token!r} as {name!r}")
        duration = len(reply.audio) / reply.rate
        # Festival's leading silence: cut to LEAD_SILENCE_S (phones and words move with it).
        first_pau = reply.segments[0][1] if reply.segments and reply.segments[0][0] == "pau" else 0.0
        cut = max(first_pau - LEAD_SILENCE_S, 0.0)
        cut = round(cut * reply.rate) / reply.rate

        def t(x: float) -> float:
            return min(max(x - cut, 0.0), duration - cut)

        spans = [(t(s[0][0]), t(s[-1][1])) if s else None for _, s in reply.tokens]
        phones: list[SpokenPhone] = []
        start = 0.0
        for name, end in reply.segments:
            if t(end) > t(start) or not phones:
                phones.append(SpokenPhone(name, t(start), t(end)))
            start = end
        audio = reply.audio[int(round(cut * reply.rate)) :]
        audio = resample(audio, reply.rate, self.sample_rate)
        return SpokenPhrase(text=text, audio=audio, sample_rate=self.sample_rate,
                            words=display_words(words, spans), phones=tuple(phones))

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._close_blocking)

    def _close_blocking(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        for p in self._procs:
            if p.proc is not None and p.proc.stdin is not None:
                try:
                    p.proc.stdin.close()  # festival --pipe exits at end of input
                except OSError:
                    pass
            p.kill()
        shutil.rmtree(self._workdir, ignore_errors=True)


def _leave_nothing(procs: list[_FestivalProcess], workdir: Path) -> None:
    """A pool nobody closed (collected, or still open at interpreter exit) leaves no festival process
    or work directory behind."""
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.proc.kill()
    shutil.rmtree(workdir, ignore_errors=True)
