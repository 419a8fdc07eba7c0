"""``python -m bench.soak [--duration S] [--interval S] [--kill-every S] [--operator auto|on|off]
[--sidecar-env NAME=VALUE …] [--out DIR]``: exit 0 when every gating series stayed flat, 1 when
one grew (or nothing could be judged), 130 when interrupted."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bench.soak.run import RESULTS, SoakConfig, soak

DEFAULTS = SoakConfig()


def _assignment(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"must be NAME=VALUE, got {text!r}")
    return name, value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument(
        "--duration", type=_positive, default=DEFAULTS.duration_s, help="seconds (default 3600)"
    )
    parser.add_argument(
        "--interval",
        type=_positive,
        default=DEFAULTS.interval_s,
        help=f"seconds between samples (default {DEFAULTS.interval_s:g})",
    )
    parser.add_argument(
        "--kill-every",
        type=_positive,
        default=DEFAULTS.kill_every_s,
        help=f"seconds between two sidecar SIGKILLs (default {DEFAULTS.kill_every_s:g})",
    )
    parser.add_argument(
        "--operator",
        choices=("auto", "on", "off"),
        default=DEFAULTS.operator,
        help="run kube-apiserver, etcd and the operator with ScheduledPublish objects "
        "(auto: when hack/tools.sh has built them)",
    )
    for component in ("sidecar", "operator"):
        parser.add_argument(
            f"--{component}-env",
            type=_assignment,
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help=f"an extra setting for the {component} (repeatable)",
        )
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"output directory (default {RESULTS})"
    )
    args = parser.parse_args(argv)
    config = SoakConfig(
        duration_s=args.duration,
        interval_s=min(args.interval, args.duration / 4),
        kill_every_s=args.kill_every,
        operator=args.operator,
        sidecar_env={**DEFAULTS.sidecar_env, **dict(args.sidecar_env)},
        operator_env={**DEFAULTS.operator_env, **dict(args.operator_env)},
    )
    summary = soak(config, args.out)
    print(summary["table"])
    if summary["interrupted"]:
        return 130
    return 0 if summary["verdict"] == "flat" else 1


if __name__ == "__main__":
    sys.exit(main())
