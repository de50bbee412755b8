"""``synchrony serve`` with the levers only benchmarks pull, kept off the product's command line.

Takes every ``synchrony serve`` option, plus:

* ``--asr-threads``: the ASR lanes decode in the server's process (``ServerConfig.asr_processes`` off);
* ``--no-degrade``: never shed work under overload (``ServerConfig.degrade`` off), so a round measures
  the full service however loaded the machine is.

It builds the same ``ServerConfig`` as ``serve`` (``app.cli.server_config``), changes only those fields
(``dataclasses.replace``) and serves it the same way (``app.cli.run_server``).
``app.loadtest.spawn.SpawnedServer(..., launcher=bench/serve.py)`` spawns it.

Usage: PYTHONPATH=$PWD python bench/serve.py [--no-degrade] [--asr-threads] [serve options]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import UsageError, build_parser, run_server, server_config  # noqa: E402
from app.exit_codes import EXIT_BAD_INPUT  # noqa: E402
from app.live.config import ServerConfig  # noqa: E402


def levers() -> argparse.ArgumentParser:
    """The bench-only options; every other argument goes to ``synchrony serve``'s parser."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--asr-threads", action="store_true", help="decode in the server's process")
    p.add_argument("--no-degrade", action="store_true", help="never shed work under overload")
    return p


def bench_config(argv: list[str]) -> tuple[argparse.Namespace, ServerConfig]:
    """``serve``'s parsed options and the config to run: ``serve``'s, with the levers applied.
    ``UsageError`` (or argparse's exit) on options ``serve`` refuses."""
    own, rest = levers().parse_known_args(argv)
    args = build_parser().parse_args(["serve", *rest])
    config = server_config(args)
    return args, dataclasses.replace(config, asr_processes=config.asr_processes and not own.asr_threads,
                                     degrade=config.degrade and not own.no_degrade)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args, config = bench_config(argv)
    except UsageError as exc:
        print(f"bench/serve.py: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return run_server(args, config)


if __name__ == "__main__":
    sys.exit(main())
