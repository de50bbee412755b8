"""The `synchrony` command line: subcommands, exit codes and one-line errors."""

from __future__ import annotations

import pytest
import torch

from app.cli import main


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for cmd in ("analyze", "serve", "loadtest", "probe", "certify", "verify", "train-controller"):
        assert cmd in out


def test_train_controller_round_trip(tmp_path, capsys):
    from models.controller import LoadController
    from models.controller_training import synthetic_dataset, write_sessions

    data = tmp_path / "sessions.csv"
    write_sessions(data, synthetic_dataset(seed=3, n_persons=3, duration_s=20))
    out = tmp_path / "ctl.pt"
    assert main(["train-controller", "--data", str(data), "--out", str(out), "--epochs", "1"]) == 0
    assert "accuracy" in capsys.readouterr().out
    assert out.stat().st_size > 1000 and isinstance(torch.load(out, weights_only=False), dict)
    LoadController(weights=out)  # the new weights load where the shipped ones do


def test_train_controller_bad_csv_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("session,pts\nx,1\n")
    assert main(["train-controller", "--data", str(bad), "--out", str(tmp_path / "c.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("synchrony train-controller:") and "missing column" in err and "\n" not in err


def test_loadtest_refuses_a_non_loopback_target(capsys):
    assert main(["loadtest", "--url", "http://192.0.2.10:8000/whip", "--peers", "1", "--duration", "5"]) == 2
    assert "loopback" in capsys.readouterr().err


def test_serve_with_no_arguments_runs_the_default_server_config(monkeypatch):
    """``ServerConfig()`` is the product: what ``synchrony serve`` runs (and ``cluster`` on each node) when
    given nothing; tests and benches start from the named ``ServerConfig.in_process`` preset instead."""
    from dataclasses import replace

    from app.cli import build_parser, server_config
    from app.live.config import ServerConfig

    monkeypatch.delenv("SYNCHRONY_TOKEN", raising=False)
    monkeypatch.delenv("SYNCHRONY_TURN_SECRET", raising=False)
    assert server_config(build_parser().parse_args(["serve"])) == ServerConfig()
    assert server_config(build_parser().parse_args(["cluster"]), ui=False) == replace(ServerConfig(), ui=False)
    preset = ServerConfig.in_process(ui=False)
    assert not preset.ui and not preset.asr_processes and not preset.degrade and preset.tts == "off"
    assert ServerConfig().asr_processes and ServerConfig().degrade and ServerConfig().admission == "measured"


def test_bench_levers_are_off_the_product_cli_and_on_the_bench_launcher(monkeypatch, tmp_path):
    """``--asr-threads`` and ``--no-degrade`` are bench/serve.py's; ``--admission`` and ``--session-cost``
    (docs/WIRE.md) stay on ``serve``. bench/capacity.py spawns a tree's launcher, or an older tree's flags."""
    from dataclasses import replace
    from pathlib import Path

    from app.cli import build_parser
    from app.live.config import ServerConfig

    monkeypatch.delenv("SYNCHRONY_TOKEN", raising=False)
    monkeypatch.delenv("SYNCHRONY_TURN_SECRET", raising=False)
    for lever in ("--asr-threads", "--no-degrade"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["serve", lever])
    build_parser().parse_args(["serve", "--admission", "fixed", "--session-cost", "0.5"])

    bench = Path(__file__).resolve().parents[1] / "bench"
    monkeypatch.syspath_prepend(str(bench))
    from capacity import full_service
    from serve import bench_config

    args, config = bench_config(["--no-degrade", "--max-sessions", "3", "--asr-threads", "--admission", "fixed"])
    assert args.max_sessions == 3
    assert config == replace(ServerConfig(), max_sessions=3, admission="fixed", degrade=False, asr_processes=False)
    assert bench_config([])[1] == ServerConfig()

    assert full_service(bench.parent) == (bench / "serve.py", ["--admission", "fixed", "--no-degrade"])
    older = tmp_path / "older"
    (older / "app").mkdir(parents=True)
    (older / "app" / "cli.py").write_text('p.add_argument("--no-degrade", action="store_true")\n')
    assert full_service(older) == (None, ["--admission", "fixed", "--no-degrade"])
    (older / "app" / "cli.py").write_text("# before degradation\n")
    assert full_service(older) == (None, [])
