"""Streaming decoder precision on this CPU: the int8 row-exact copy of the decoder blocks vs fp32.

Why: :class:`models.int8.RowInt8Linear` multiplies in integers (``torch._int_mm``), which is fast
only where the CPU has native int8 products and several times slower than fp32 elsewhere
(docs/asr-measurements.md). The engine therefore times both once per process
(:func:`models.int8.rowwise_int8_pays`) and keeps the fp32 blocks where int8 loses. This bench
checks that choice on whole streams: the same held-out sessions (bench/asr_stream.py's ``HELD_OUT``
sets and held-out voices, none tuned on) decoded by :class:`models.asr.StreamingASR` with either
precision, fed 20 ms chunks as fast as it decodes (``asr_stream.run_simulated``, whose CPU time
counts only the recogniser's own calls).

Prints per set and pooled: streaming WER and CPU seconds of each precision, and which one the
engine picks here. Exit 1 when the pick costs more CPU than the other, or its pooled WER is more
than 1 point worse.

    .venv/bin/python bench/asr_precision.py [--sessions 4]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import asr_stream  # noqa: E402 - the held-out sets, session maker, chunking and WER of that bench

from models.asr import StreamingConfig, WhisperEngine  # noqa: E402
from models.int8 import rowwise_int8_pays  # noqa: E402
from models.whisper_loader import load_whisper  # noqa: E402

WER_SLACK_POINTS = 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=4, help="sessions of 5 sentences per held-out set")
    args = ap.parse_args()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} cpus")
    sets = [(name, sentences, asr_stream.VOICES) for name, sentences in asr_stream.HELD_OUT.items()]
    sets.append(("held-out voices", asr_stream.SENTENCES, asr_stream.HELD_OUT_VOICES))
    # All audio before any decoding: libespeak-ng keeps state between syntheses.
    sessions = [(name, [asr_stream.make_session(k, 5, s, v) for k in range(args.sessions)]) for name, s, v in sets]
    model = load_whisper()
    picked = "int8" if rowwise_int8_pays() else "fp32"
    wer: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for name in ("fp32", "int8"):
        engine = WhisperEngine(model, int8=True, int8_decoder=name == "int8")
        # Warm (numba compiles the DTW in the first decode) on 2 s of speech, outside the clock.
        engine.transcribe(sessions[0][1][0].audio[: 2 * asr_stream.SAMPLE_RATE])
        refs_all: list[str] = []
        hyps_all: list[str] = []
        cpu[name] = 0.0
        for set_name, group in sessions:
            run = asr_stream.run_simulated(group, StreamingConfig(), engine)
            refs, hyps = asr_stream.spoken(group), [w for words in run.finals for w in words]
            print(f"  {name} {set_name}: WER {100 * asr_stream.wer(refs, hyps):.1f}% ({len(refs)} words)", flush=True)
            refs_all += refs
            hyps_all += hyps
            cpu[name] += run.cpu_s
        wer[name] = asr_stream.wer(refs_all, hyps_all)
        print(f"{name}: pooled WER {100 * wer[name]:.1f}% ({len(refs_all)} words), {cpu[name]:.0f} CPU s", flush=True)
    other = "fp32" if picked == "int8" else "int8"
    cheaper = cpu[picked] <= cpu[other]
    close = 100 * (wer[picked] - wer[other]) <= WER_SLACK_POINTS
    print(f"this CPU picks {picked}: CPU {cpu[picked]:.0f} s vs {other} {cpu[other]:.0f} s "
          f"({'PASS' if cheaper else 'FAIL'}: the cheaper one); WER {100 * wer[picked]:.1f}% vs "
          f"{100 * wer[other]:.1f}% ({'PASS' if close else 'FAIL'}: within {WER_SLACK_POINTS:.0f} point)")
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    return 0 if cheaper and close else 1


if __name__ == "__main__":
    sys.exit(main())
