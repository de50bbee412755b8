"""Speech from any OpenAI-compatible ``POST {base_url}/audio/speech``, timed by our own aligner.

Such an endpoint returns audio and nothing else, so word and phone times come from the project's
forced aligner (:mod:`alignment.forced`, PocketSphinx) run on the returned audio against the
normalised words we sent: the same independent timing the live ASR trusts. The reply is decoded
with PyAV, so WAV, MP3, Opus or FLAC all work. The speaking rate goes as OpenAI's ``speed``
(``wpm / natural_wpm``); a server that ignores it speaks at its own rate. Every step has a
timeout and the whole request a deadline; a server that is down, slow, answers an error, or
returns bytes that are not speech of the words raises :class:`TTSError` naming the URL.
Decoding and alignment run in one worker thread (an aligner is per thread).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np

from alignment.types import SAMPLE_RATE, SpokenPhone, SpokenPhrase
from models.http_client import shared_client
from models.tts.base import TTSError, check_request, display_words, empty_phrase
from models.tts.normalize import NormalizedWord, bare, normalize_text, spoken_text

log = logging.getLogger(__name__)

#: What a typical hosted voice speaks at speed 1 (words per minute): the base of ``speed``.
DEFAULT_NATURAL_WPM = 170.0
#: Less audio than this is no answer (a server that returned an empty or truncated file).
_MIN_AUDIO_S = 0.1


class OpenAITTS:
    """Speaks phrases through an OpenAI-compatible speech endpoint; one instance serves every session."""

    name = "openai"

    def __init__(self, base_url: str, model: str = "tts-1", voice: str = "alloy", api_key: str | None = None, *,
                 timeout_s: float = 10.0, connect_timeout_s: float = 2.0, natural_wpm: float = DEFAULT_NATURAL_WPM,
                 sample_rate: int = SAMPLE_RATE) -> None:
        if not base_url or not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/audio/speech"
        self.model = model
        self.voice = voice
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = float(timeout_s)
        self.natural_wpm = float(natural_wpm)
        self.sample_rate = int(sample_rate)
        self._timeout = httpx.Timeout(connect=connect_timeout_s, read=timeout_s, write=5.0, pool=5.0)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tts-align")

    async def warm(self) -> None:
        """The aligner's decoder built in the worker thread (the endpoint itself is not called)."""
        from alignment.forced import warm_this_thread

        await asyncio.get_running_loop().run_in_executor(self._executor, warm_this_thread)

    async def synthesize(self, text: str, wpm: float) -> SpokenPhrase:
        wpm = check_request(text, wpm)
        words = normalize_text(text)
        if not any(w.spoken for w in words):
            return empty_phrase(text, self.sample_rate)
        data = await self._fetch(spoken_text(words), wpm)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._timed, text, words, data)

    async def _fetch(self, spoken: str, wpm: float) -> bytes:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        body = {"model": self.model, "input": spoken, "voice": self.voice, "response_format": "wav",
                "speed": round(min(max(wpm / self.natural_wpm, 0.25), 4.0), 3)}
        try:
            client = await shared_client()
            resp = await asyncio.wait_for(client.post(self.url, json=body, headers=headers, timeout=self._timeout),
                                          self.timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            raise TTSError(f"TTS at {self.url} timed out after {self.timeout_s:g} s") from None
        except httpx.ConnectError as exc:
            raise TTSError(f"TTS at {self.url} is unreachable ({exc})") from None
        except httpx.HTTPError as exc:
            raise TTSError(f"TTS at {self.url} failed: {exc}") from None
        if resp.status_code != 200:
            raise TTSError(f"TTS at {self.url} answered HTTP {resp.status_code}: {_message(resp)}")
        if not resp.content:
            raise TTSError(f"TTS at {self.url} returned no audio")
        return resp.content

    def _timed(self, text: str, words: tuple[NormalizedWord, ...], data: bytes) -> SpokenPhrase:
        """Decode the reply and align the spoken tokens to it (in the worker thread)."""
        from alignment.forced import aligner

        audio = decode_audio(data, SAMPLE_RATE)
        if audio is None or len(audio) < _MIN_AUDIO_S * SAMPLE_RATE:
            raise TTSError(f"TTS at {self.url} returned something that is not audio")
        tokens = [bare(s) for w in words for s in w.spoken]
        aligned = aligner().align_phones(audio, tokens)
        if aligned is None:
            raise TTSError(f"TTS at {self.url} returned audio in which the words could not be found")
        spans, phone_spans = aligned
        duration = len(audio) / SAMPLE_RATE

        def clip(t: float) -> float:  # the aligner may put a first word in the silence it padded with
            return min(max(t, 0.0), duration)

        phones = tuple(SpokenPhone(p, s, e) for p, s, e in phone_spans)
        if self.sample_rate != SAMPLE_RATE:
            from alignment.espeak import resample

            audio = resample(audio, SAMPLE_RATE, self.sample_rate)
        timed = [None if s is None else (clip(s.start), clip(s.end)) for s in spans]
        return SpokenPhrase(text=text, audio=audio, sample_rate=self.sample_rate,
                            words=display_words(words, timed), phones=phones)

    async def aclose(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def decode_audio(data: bytes, rate: int) -> np.ndarray | None:
    """Any audio file's first audio stream as mono float32 at ``rate``; None when it is not audio."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.audio:
                return None
            resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
            parts = []
            for frame in container.decode(audio=0):
                for out in resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1))
            for out in resampler.resample(None):
                parts.append(out.to_ndarray().reshape(-1))
    except (av.error.FFmpegError, ValueError, OSError) as exc:
        log.debug("undecodable TTS reply: %s", exc)
        return None
    if not parts:
        return None
    return np.concatenate(parts).astype(np.float32)


def _message(resp: httpx.Response) -> str:
    try:
        return str(resp.json()["error"]["message"])[:200]
    except (ValueError, KeyError, TypeError):
        return resp.text[:200].strip() or resp.reason_phrase
