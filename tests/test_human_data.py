"""The hand-read human speech sets: every clip names a fetchable source, a known speaker of one part of the split,
and onsets in order with a confidence mark (bench/data; the audio itself is fetched by the benches, not here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.human_data import source_path

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
CONFIDENCE = {"clear", "unclear", "high", "low"}


def _sets() -> list[tuple[str, dict]]:
    return [(n, json.loads((DATA / n).read_text())) for n in ("human_speech.json", "human_onsets.json",
                                                             "isolated_words.json")]


@pytest.mark.parametrize(("name", "data"), _sets())
def test_every_clip_has_a_split_speaker_and_ordered_hand_read_onsets(name: str, data: dict) -> None:
    parts = data["split"]
    assert not set(parts["tuning"]) & set(parts["heldout"]), name
    for clip in data["clips"]:
        origin, _, rest = clip["source"].partition(":")
        assert origin in {"gradio", "alsa", "debian", "pypi", "npm"} and rest, clip["source"]
        assert clip["speaker"] in data["speakers"], clip["source"]
        assert clip["speaker"] in parts["tuning"] + parts["heldout"], clip["source"]
        words = clip.get("words") or ([clip] if "onset" in clip else [])
        onsets = [w["onset"] for w in words]
        assert onsets == sorted(onsets) and all(t >= 0 for t in onsets), clip["source"]
        assert all(w["confidence"] in CONFIDENCE and w["text"] for w in words), clip["source"]


def test_a_speaker_is_in_the_same_part_in_every_set() -> None:
    part: dict[str, str] = {}
    for name, data in _sets():
        for p, speakers in data["split"].items():
            for s in speakers:
                assert part.setdefault(s, p) == p, (name, s)


def test_the_connected_set_has_both_sexes() -> None:
    data = json.loads((DATA / "human_speech.json").read_text())
    sexes = {data["speakers"][c["speaker"]]["sex"] for c in data["clips"]}
    assert {"male", "female"} <= sexes


@pytest.mark.parametrize("source", ["pypi:pocketsphinx/test/data/goforward.raw", "npm:nodejs-whisper/jfk.wav",
                                    "ftp:somewhere/x.wav"])
def test_an_unpinned_or_unknown_source_is_a_clear_error(source: str) -> None:
    with pytest.raises(ValueError, match="source"):
        source_path(source)
