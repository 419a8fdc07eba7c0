"""``schedlock operator``: flags and settings here; kopf and the Kubernetes client load only
when the command runs (the sidecar shares the console script and must stay small)."""

from __future__ import annotations

import argparse
import asyncio

from schedlock.core.settings import add_command
from schedlock.operator.settings import OperatorSettings


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        subparsers,
        "operator",
        OperatorSettings,
        run,
        summary="run the Kubernetes operator for ScheduledPublish objects",
        description="Reconcile ScheduledPublish objects (schedlock.dev/v1) into database rows and reflect "
        "outcomes back into their status and Events.",
    )


def run(settings: OperatorSettings, _args: argparse.Namespace) -> int:
    from schedlock.operator.app import run as run_operator

    return asyncio.run(run_operator(settings))
