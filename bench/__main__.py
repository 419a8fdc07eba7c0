"""``python -m bench run [--quick | --smoke] [--only SCENARIO …] [--out DIR]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.runner import RESULTS, SCENARIOS, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("run", help="run the benchmark, print the table, write the results")
    size = cmd.add_mutually_exclusive_group()
    size.add_argument(
        "--quick", action="store_true", help="fewer trials and smaller sizes (< 3 min)"
    )
    size.add_argument(
        "--smoke",
        action="store_true",
        help="one short trial per scenario with shortened timings: checks the harness only",
    )
    cmd.add_argument(
        "--only",
        nargs="+",
        choices=SCENARIOS,
        metavar="SCENARIO",
        help=f"run only these scenarios (of: {', '.join(SCENARIOS)})",
    )
    cmd.add_argument(
        "--out", type=Path, default=RESULTS, help=f"results directory (default {RESULTS})"
    )
    docs = cmd.add_mutually_exclusive_group()
    docs.add_argument(
        "--docs",
        dest="docs",
        action="store_true",
        default=None,
        help="write the table into docs/performance.md (default: only after a full run of "
        "every scenario)",
    )
    docs.add_argument("--no-docs", dest="docs", action="store_false")
    cmd.add_argument(
        "--keep", action="store_true", help="keep the run's working directory (logs) afterwards"
    )
    args = parser.parse_args(argv)
    profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    return run(
        profile_name=profile,
        only=list(args.only or SCENARIOS),
        out=args.out,
        write_docs=args.docs,
        keep=args.keep,
    )


if __name__ == "__main__":
    sys.exit(main())
