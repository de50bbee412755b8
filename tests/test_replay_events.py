"""The replay harness (bench/replay_events.py) is deterministic: one clip replayed twice gives the same
events. No golden file here: another CPU may decode other floats; the bench holds the baseline."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from tests.live_fixtures import live_stages  # noqa: F401 - shared session fixture


def _bench() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / "replay_events.py"
    spec = importlib.util.spec_from_file_location("replay_events", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("replay_events", module)
    spec.loader.exec_module(module)
    return module


async def test_a_clip_replayed_twice_gives_identical_events(live_stages):  # noqa: F811
    bench = _bench()
    spec = bench.ClipSpec("short", "please send the report before noon", "en-us", 0.4, 1.0, markers=(0.2,))
    clip = bench.build_clip(spec)
    runs = [[bench.canonical(e) for e in await bench.replay_clip(spec, clip, live_stages, f"replay-test-{i}")]
            for i in range(2)]
    for events in runs:  # the session id is the one field that differs by design
        events[0]["session"] = "-"
    assert runs[0] == runs[1]
    kinds = {e["type"] for e in runs[0]}
    assert {"hello", "au", "token", "sync", "response", "lst"} <= kinds, kinds
