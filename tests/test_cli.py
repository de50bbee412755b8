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
