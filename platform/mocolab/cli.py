"""``mocolab`` command line: ``mocolab train --preset cpu-quick --set moco.m=0.9``."""

from __future__ import annotations

import argparse
import sys

from .config import build_config, list_presets


def _train(args: argparse.Namespace) -> int:
    from .loop import run_training  # imported late: torch start-up is not needed for --help

    cfg = build_config(args.preset, args.set or [])
    if args.print_config:
        for key, value in cfg.flatten().items():
            print(f"{key} = {value}")
    result = run_training(cfg, measure_init=args.measure_init)
    if result.diverged:
        print(f"training diverged after {result.steps} steps (final loss {result.final_loss})", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mocolab", description="Momentum Contrast experiments.")
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train", help="train one MoCo model in this process and report the linear probe")
    tr.add_argument("--preset", default="cpu-quick", help=f"one of {list_presets()} (default cpu-quick)")
    tr.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config field, e.g. --set moco.m=0.9 (repeatable)")
    tr.add_argument("--print-config", action="store_true", help="print the resolved config first")
    tr.add_argument("--measure-init", action="store_true", help="also measure kNN top-1 before training")
    tr.set_defaults(func=_train)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:  # configuration mistakes: one clear line, no traceback
        print(f"mocolab: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
