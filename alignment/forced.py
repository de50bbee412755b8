"""Forced alignment of known words to speech with PocketSphinx's acoustic model.

Word times must hold for any speaker, not only for voices that sound like a reference
synthesizer. PocketSphinx's en-us acoustic model (continuous HMMs trained on many human speakers;
the model, CMUdict and the decoder ship in the ``pocketsphinx`` wheel) aligns a transcript to
the audio phone by phone in 10 ms frames, with optional silence between words. Words CMUdict
lacks (names, Whisper's misspellings, digits) are pronounced by espeak-ng's letter-to-sound rules
(:func:`alignment.espeak.phonemes`) mapped onto the model's ARPAbet phones.

A decoder is not thread-safe and costs ~20 MB, so each thread that aligns gets its own
(:func:`aligner`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from alignment.text import dictionary_form
from alignment.types import SAMPLE_RATE

log = logging.getLogger(__name__)

FRAME_S = 0.01
#: Viterbi beams wide enough that an alignment of fast or unusual speech is never pruned away
#: (the decoder's defaults lost one sentence in twelve of fast synthetic speech).
_BEAMS = {"beam": 1e-80, "wbeam": 1e-60, "pbeam": 1e-80}
#: Silence added at both ends: the alignment's first and last words need room for their <sil>
#: (without it the last word was now and then dropped from the segmentation).
_PAD_S = 0.1
#: Dither (≈ -80 dBFS): digital silence has no spectrum, and the model's features break on it.
_DITHER = 1e-4
#: Rebuild a decoder after this many added pronunciations, so its dictionary stays bounded.
_MAX_ADDED_WORDS = 2000
_FILLERS = {"<s>", "</s>", "<sil>", "[NOISE]", "[SPEECH]", "(NULL)"}

#: espeak-ng's English phoneme mnemonics → the acoustic model's ARPAbet phones (longest match
#: first; stress marks and syllable/word marks are dropped).
_ESPEAK_TO_ARPABET: dict[str, str] = {
    "aI@": "AY ER", "aU@": "AW ER", "i@3": "IH R", "e@": "EH R", "i@": "IH R", "U@": "UH R", "O@": "AO R",
    "o@": "AO R", "A@": "AA R", "A:": "AA", "aI": "AY", "aU": "AW", "eI": "EY", "oU": "OW", "OI": "OY",
    "i:": "IY", "u:": "UW", "3:": "ER", "O:": "AO", "@L": "AH L", "@2": "AH", "@5": "AH", "I2": "IH",
    "I#": "IH", "a#": "AH", "aa": "AE", "@": "AH", "3": "ER", "a": "AE", "e": "EH", "E": "EH", "i": "IY",
    "I": "IH", "0": "AA", "O": "AO", "o": "OW", "U": "UH", "u": "UW", "V": "AH", "A": "AA",
    "tS": "CH", "dZ": "JH", "t#": "T", "d#": "D", "z#": "Z", "n-": "N", "l-": "L", "r-": "R", "m-": "M",
    "p": "P", "b": "B", "t": "T", "d": "D", "k": "K", "g": "G", "f": "F", "v": "V", "T": "TH", "D": "DH",
    "s": "S", "z": "Z", "S": "SH", "Z": "ZH", "h": "HH", "m": "M", "n": "N", "N": "NG", "l": "L", "r": "R",
    "w": "W", "j": "Y", "x": "K", "?": "T", "C": "HH",
}
_MNEMONICS = sorted(_ESPEAK_TO_ARPABET, key=len, reverse=True)


@dataclass(frozen=True)
class AlignedWord:
    """One word's span in the aligned audio (s from the audio's first sample)."""

    start: float
    end: float


def espeak_arpabet(word: str) -> str:
    """ARPAbet phones for any spelling, from espeak-ng's pronunciation ("" if it has none)."""
    from alignment.espeak import phonemes

    mnemonics = phonemes(word)
    phones: list[str] = []
    i = 0
    while i < len(mnemonics):
        for m in _MNEMONICS:
            if mnemonics.startswith(m, i):
                phones.append(_ESPEAK_TO_ARPABET[m])
                i += len(m)
                break
        else:
            i += 1  # stress, length and boundary marks, or a mnemonic with no English counterpart
    return " ".join(phones)


class ForcedAligner:
    """Aligns a word sequence to 16 kHz mono audio (one thread at a time; see :func:`aligner`)."""

    def __init__(self) -> None:
        self._decoder = None
        self._added = 0
        self._cmn = ""

    def _new_decoder(self) -> object:
        from pocketsphinx import Decoder

        self._added = 0
        # bestpath (lattice rescoring) is for language-model search; in alignment it could return
        # a path without the last word.
        dec = Decoder(samprate=SAMPLE_RATE, loglevel="FATAL", bestpath=False, **_BEAMS)
        self._cmn = dec.get_cmn()
        return dec

    @staticmethod
    def _pcm(audio: np.ndarray) -> bytes:
        """The audio as the decoder hears it: padded with dithered silence, 16-bit."""
        pad = np.zeros(int(_PAD_S * SAMPLE_RATE), np.float32)
        x = np.concatenate([pad, np.asarray(audio, np.float32), pad])
        x += np.random.default_rng(0).normal(0.0, _DITHER, len(x)).astype(np.float32)
        return (np.clip(x, -1.0, 1.0) * 32767.0).astype(np.int16).tobytes()

    def _run(self, dec: object, audio: np.ndarray, text: str) -> list[tuple[str, int, int]] | None:
        """Decode ``audio`` against ``text``: (word, first frame, last frame) of the padded audio."""
        # The decoder carries state from one utterance to the next (Gaussian selection starts from
        # the last frame's), which moved first words by up to 50 ms with what was aligned before.
        # The same short silent utterance before each call puts it in the same state every time.
        pcm = self._pcm(audio)
        try:
            _reset(dec, self._cmn)
            dec.set_align_text(text)
            dec.start_utt()
            dec.process_raw(pcm, full_utt=True)
            dec.end_utt()
        except RuntimeError as exc:
            log.debug("forced alignment failed: %s", exc)
            return None
        if dec.hyp() is None:
            return None
        return [(s.word, s.start_frame, s.end_frame) for s in dec.seg()]

    def _spell(self, word: str) -> str | None:
        """The dictionary entry to align ``word`` with (added from espeak-ng when CMUdict lacks it)."""
        key = dictionary_form(word)
        if not key:
            return None
        if self._decoder.lookup_word(key) is not None:
            return key
        from alignment.espeak import EspeakUnavailable

        try:
            phones = espeak_arpabet(key)
        except EspeakUnavailable:
            return None
        if not phones:
            return None
        try:
            self._decoder.add_word(key, phones, update=True)
        except RuntimeError:  # a pronunciation the model cannot take: the word is left out
            return None
        self._added += 1
        return key

    def align(self, audio: np.ndarray, words: Sequence[str]) -> list[AlignedWord | None] | None:
        """Each word's span in ``audio``; None for a word that cannot be pronounced, and None for
        the whole call when no alignment of the words fits the audio."""
        if self._decoder is None or self._added >= _MAX_ADDED_WORDS:
            self._decoder = self._new_decoder()
        spelled = [self._spell(w) for w in words]
        text = [s for s in spelled if s is not None]
        if not text or len(audio) < 3 * int(FRAME_S * SAMPLE_RATE) * len(text):
            return None
        segs = self._run(self._decoder, audio, " ".join(text))
        if segs is None:
            return None
        # The silence padded on is not the audio: a word started in it (a stop's silent closure stretched
        # over the pause before it) starts at the audio's first sample.
        spans = [AlignedWord(max(first * FRAME_S - _PAD_S, 0.0), (last + 1) * FRAME_S - _PAD_S)
                 for word, first, last in segs if word not in _FILLERS]
        if len(spans) != len(text):
            return None
        duration = len(audio) / SAMPLE_RATE
        if spans[-1].start > duration - 2 * FRAME_S:
            return None  # the last word put in the padding after the audio: the words did not fit it
        it = iter(spans)
        return [None if s is None else next(it) for s in spelled]

    def align_phones(self, audio: np.ndarray, words: Sequence[str]
                     ) -> tuple[list[AlignedWord | None], list[tuple[str, float, float]]] | None:
        """:meth:`align`, plus every phone's (name, start, end) from a second, phone-level pass over
        the same audio (PocketSphinx's sub-word alignment; names are the model's ARPAbet in lower
        case, silence as ``pau``, as festival names them). Phones are empty where that pass fails."""
        spans = self.align(audio, words)
        if spans is None:
            return None
        duration = len(audio) / SAMPLE_RATE
        phones = []
        for ph in self._phone_pass(audio) or []:
            start = min(max(ph.start * FRAME_S - _PAD_S, 0.0), duration)
            end = min(max((ph.start + ph.duration) * FRAME_S - _PAD_S, 0.0), duration)
            if end > start:
                name = ph.name.lower()
                phones.append(("pau" if name in ("sil", "+nsn+", "+spn+") else name, start, end))
        return spans, phones

    def fit(self, audio: np.ndarray, words: Sequence[str]) -> float | None:
        """How well ``words`` explain ``audio``: the phone-level alignment's summed acoustic score
        (log-likelihood, higher is better), None where the words do not fit it. Only two texts
        scored on the same audio compare: whether a word's audio is there, not just its place."""
        if self.align(audio, words) is None:
            return None
        entries = self._phone_pass(audio)
        return float(sum(ph.score for ph in entries)) if entries else None

    def _phone_pass(self, audio: np.ndarray) -> list[object] | None:
        """The phone-level pass over ``audio`` for the text the last :meth:`align` set (None where
        it fails)."""
        dec = self._decoder
        try:
            dec.set_alignment()
            dec.start_utt()
            dec.process_raw(self._pcm(audio), full_utt=True)
            dec.end_utt()
            alignment = dec.get_alignment()
            return list(alignment.phones()) if alignment is not None else []
        except RuntimeError as exc:
            log.debug("phone alignment failed: %s", exc)
            return None


_RESET_PCM = (np.random.default_rng(1).normal(0.0, _DITHER, int(0.2 * SAMPLE_RATE)) * 32767.0
              ).astype(np.int16).tobytes()


def _reset(dec: object, cmn: str) -> None:
    """The decoder's state as new: its cepstral-mean prior and noise statistics, then a fixed
    silent utterance (its result is not used) for the rest."""
    dec.set_cmn(cmn)
    dec.start_stream()
    dec.set_align_text("a")
    dec.start_utt()
    dec.process_raw(_RESET_PCM, full_utt=True)
    dec.end_utt()


_LOCAL = threading.local()


def aligner() -> ForcedAligner:
    """This thread's aligner (decoders are not thread-safe; decode lanes each get one)."""
    a = getattr(_LOCAL, "aligner", None)
    if a is None:
        a = _LOCAL.aligner = ForcedAligner()
    return a


def warm_this_thread() -> None:
    """Build this thread's decoder and run it once (a decode lane calls this as it starts), so the
    first session's first words do not wait for the acoustic model to load."""
    if available():
        aligner().align(np.zeros(SAMPLE_RATE // 2, np.float32), ["a"])


@lru_cache(maxsize=1)
def available() -> bool:
    """True when the pocketsphinx package (with its bundled en-us model) imports."""
    try:
        import pocketsphinx  # noqa: F401
    except ImportError:
        return False
    return True
