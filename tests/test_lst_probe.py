"""`synchrony probe` against a live server: exit 0 at or above the required tier, 1 below, 3 unreadable."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from alignment.lst import LSTAggregate
from app.live.server import ServerConfig, create_app, running_server
from app.live.stages import Stages
from app.loadtest.probe import judge, lst_url

ROOT = Path(__file__).resolve().parents[1]


async def _probe_cli(*args: str) -> tuple[int, str, str]:
    """The real command line, in a subprocess."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "probe", *args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def _probe(capsys, *args: str) -> tuple[int, str, str]:
    """``synchrony probe`` in a thread of this process (the server keeps serving on this loop)."""
    from app.cli import main

    code = await asyncio.to_thread(main, ["probe", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _silver_stream(agg: LSTAggregate) -> None:
    """TTFT 50 ms from the request (turn 650 ms), ITLs 100, 100, 110 ms: σ 4.7 ms → Silver."""
    m = agg.meter("s1")
    m.begin_response(10.0, speech_end_t=9.4)
    for t in (10.050, 10.150, 10.250, 10.360):
        m.token(t)
    m.response_end()


async def test_probe_exit_codes_follow_the_tier(capsys):
    agg = LSTAggregate()
    app = create_app(ServerConfig.in_process(ui=False, stages=()), stages=Stages(lst=agg))
    async with running_server(app) as base:
        code, out, _ = await _probe(capsys, base, "--require", "bronze")
        assert code == 1 and "only 0 responses" in out  # nothing measured yet is not a pass
        assert (await _probe(capsys, base))[0] == 0  # nothing required: report only
        _silver_stream(agg)
        code, out, _ = await _probe(capsys, base + "/whip", "--require", "silver")
        assert code == 0, out
        assert "LST TTFT p99 (request written → first content read): 50.0 ms" in out and "tier: silver" in out
        assert "turn latency (end of speech → first token, turn-hold included): p50 650.0 ms" in out
        assert "definitions v3" in out and "SEQ-Integrity None over 0 answers" in out
        code, out, _ = await _probe_cli(base + "/metrics/lst", "--require", "gold")
        assert code == 1 and "FAIL: tier silver is below the required gold" in out
    code, _, err = await _probe(capsys, base, "--require", "bronze", "--timeout", "2")  # the server is gone
    assert code == 3 and err.startswith("synchrony probe: cannot reach") and "Traceback" not in err


async def test_probe_without_an_lst_stage_is_unreadable(capsys):
    app = create_app(ServerConfig.in_process(ui=False, stages=()))
    async with running_server(app) as base:
        code, _, err = await _probe(capsys, base, "--require", "bronze")
    assert code == 3 and "HTTP 503" in err


def test_probe_usage_errors():
    with pytest.raises(ValueError, match="must start with http"):
        lst_url("127.0.0.1:8000")
    assert lst_url("http://h:1/whip") == "http://h:1/metrics/lst"
    assert judge({"tier": "gold", "ttft_samples": 3}, "silver") == (True, "tier gold meets silver")
    ok, why = judge({"tier": "gold", "ttft_samples": 3}, "gold", min_responses=5)
    assert not ok and "only 3 responses" in why
