"""Command line of the chaos run."""

from __future__ import annotations

import argparse
import random
import time
import warnings
from pathlib import Path

from chaos.config import ChaosConfig

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run 5 sidecars for each of 2 targets, the operator, PostgreSQL and ~16 "
        "one-shot rows a second plus '@every 1s' schedules under a seeded random schedule of "
        "faults, then judge the apps' delivery logs. Exit 0: no violation; 1: a violation; "
        "2: the harness could not run; 130: interrupted.",
    )
    parser.add_argument(
        "--duration", type=float, default=600.0, help="seconds of load (default 600)"
    )
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--verdict", type=Path, default=REPO / "chaos-verdict.json")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="run directory (default under /tmp)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directory after a pass")
    parser.add_argument("--no-operator", action="store_true", help="no kube-apiserver/operator")
    parser.add_argument(
        "--check", type=Path, metavar="RUN_DIR", help="only recompute the verdict of a kept run"
    )
    args = parser.parse_args(argv)
    # kopf (imported for the operator's RBAC rules) warns about a missing XDG_RUNTIME_DIR.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")

    from chaos import run

    verdict = args.verdict.resolve()
    if args.check is not None:
        return run.check_only(args.check, verdict)
    if args.duration < 60:
        parser.error("--duration must be at least 60 seconds")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 10**6)
    config = ChaosConfig(seed=seed, duration=args.duration, with_operator=not args.no_operator)
    rundir = args.workdir or Path("/tmp/schedlock-chaos") / (
        f"{time.strftime('%Y%m%d-%H%M%S')}-seed{seed}"
    )
    return run.run(config, rundir.resolve(), verdict, keep=args.keep)
