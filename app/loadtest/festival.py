"""Speech from Debian's ``festival`` synthesizer, with the exact onset of every word.

A second source of ground truth for word timing, independent of espeak-ng (which the refinement
once used as its own reference, so espeak-ng speech could not tell whether a method worked on
voices other than its own). Festival's voices are built differently: ``cmu_us_slt_arctic_hts`` is
a statistical (HTS) voice trained on a human speaker's recordings, ``kal_diphone`` and
``ked_diphone`` are concatenations of recorded human diphones. A word's onset is the start of its
first segment (Word → SylStructure → Segment relations), the same convention as espeak-ng's word
events (a stop's closure belongs to the word).

Festival runs as a subprocess (``festival --batch``); install ``festival festvox-us-slt-hts
festvox-kallpc16k festvox-kdlpc16k`` (the Makefile does). The voice names and the install check are
:mod:`models.tts.festival`'s, whose resident pool speaks the product's answers.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import wave
from pathlib import Path

import numpy as np

from alignment.espeak import Speech, TimedWord, resample
from alignment.types import SAMPLE_RATE
from models.tts.festival import VOICES, available

__all__ = ["VOICES", "FestivalUnavailable", "available", "synthesize_festival"]

# Duration_Stretch is pinned to 1: the diphone voices default to 1.1, the HTS voice to 1.
_SCRIPT = """({voice})
(Parameter.set 'Duration_Stretch 1)
(set! utt (utt.synth (Utterance Text "{text}")))
(utt.save.wave utt "{wav}" 'riff)
(mapcar (lambda (w)
  (let ((syl (item.relation.daughter1 w 'SylStructure)))
    (if syl (format t "WORD\\t%s\\t%f\\n" (item.name w) (item.feat (item.daughter1 syl) "segment_start")))))
  (utt.relation.items utt 'Word))
(mapcar (lambda (s)
  (if (not (string-equal (item.name s) "pau")) (format t "PHONE_END\\t%f\\n" (item.feat s "end"))))
  (utt.relation.items utt 'Segment))
"""
_SAFE = re.compile(r"[^a-zA-Z' ]+")


class FestivalUnavailable(RuntimeError):
    """festival or the asked voice is not installed (``apt-get install festival festvox-...``)."""


def synthesize_festival(text: str, voice: str = "slt_hts", lead_in_s: float = 0.0, timeout_s: float = 60.0
                        ) -> Speech:
    """Speak ``text`` (plain words) with festival; 16 kHz audio and each word's exact onset.

    ``lead_in_s`` of silence is prepended (and added to the onsets). Festival's own leading pause
    is kept (the onsets account for it).
    """
    if voice not in VOICES:
        raise ValueError(f"unknown festival voice {voice!r}; choose from {sorted(VOICES)}")
    if not available(voice):
        raise FestivalUnavailable(f"festival voice {voice!r} is not installed")
    clean = " ".join(_SAFE.sub(" ", text).split())
    with tempfile.TemporaryDirectory(prefix="festival-") as tmp:
        wav = Path(tmp) / "speech.wav"
        script = Path(tmp) / "say.scm"
        script.write_text(_SCRIPT.format(voice=VOICES[voice], text=clean, wav=wav))
        try:
            out = subprocess.run(["festival", "--batch", str(script)], capture_output=True, text=True,
                                 timeout=timeout_s, check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise FestivalUnavailable(f"festival failed: {exc}") from exc
        with wave.open(str(wav), "rb") as fh:
            rate = fh.getframerate()
            pcm = np.frombuffer(fh.readframes(fh.getnframes()), dtype=np.int16)
    audio = resample(pcm.astype(np.float32) / 32768.0, rate, SAMPLE_RATE)
    words, phone_ends = [], []
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] == "WORD":
            words.append(TimedWord(parts[1], float(parts[2]) + lead_in_s))
        elif len(parts) == 2 and parts[0] == "PHONE_END":
            phone_ends.append(float(parts[1]) + lead_in_s)
    lead = np.zeros(int(round(lead_in_s * SAMPLE_RATE)), np.float32)
    return Speech(np.concatenate([lead, audio]), tuple(words), clean, max(phone_ends, default=None))
