"""``schedlock operator``: flags and settings here; kopf and the Kubernetes client load only
when the command runs (the sidecar shares the console script and must stay small)."""

from __future__ import annotations

import argparse
import asyncio

from schedlock.core import logs
from schedlock.core.settings import add_arguments, build
from schedlock.operator.settings import OperatorSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "operator",
        help="run the Kubernetes operator for ScheduledPublish objects",
        description=(
            "Reconcile ScheduledPublish objects (schedlock.dev/v1) into database rows and "
            "reflect outcomes back into their status and Events. Every flag can also be set "
            "by its SCHEDLOCK_* variable."
        ),
    )
    add_arguments(parser, OperatorSettings)
    parser.set_defaults(command=command, command_name="operator")


def command(args: argparse.Namespace) -> int:
    settings = build(OperatorSettings, args)
    logs.configure(settings.log_level, settings.log_format)
    from schedlock.operator.app import run

    return asyncio.run(run(settings))
