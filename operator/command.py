"""``schedlock operator``: flags and settings here; kopf and the Kubernetes client load only
when the command runs (the sidecar shares the console script and must stay small).

They come with the ``operator`` extra (``pip install 'schedlock[operator]'``; the ``schedlock``
image has it, the ``schedlock-sidecar`` image does not): without them the command says so in
one line and exits 2, before it reads any setting.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util

from schedlock.core.settings import EXIT_BAD_SETTING, CommandError, add_command
from schedlock.operator.settings import OperatorSettings

# What the operator imports beyond every command's dependencies (pyproject.toml, the extra).
OPERATOR_EXTRA = ("kopf", "kubernetes")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_command(
        subparsers,
        "operator",
        OperatorSettings,
        run,
        summary="run the Kubernetes operator for ScheduledPublish objects",
        description="Reconcile ScheduledPublish objects (schedlock.dev/v1) into database rows and reflect "
        "outcomes back into their status and Events.",
        prerequisite=require_operator_extra,
    )


def missing_extra() -> list[str]:
    """The operator extra's packages this installation lacks."""
    return [name for name in OPERATOR_EXTRA if importlib.util.find_spec(name) is None]


def require_operator_extra() -> None:
    """Refuse in one line, exit status 2, when the installation lacks the operator's extra."""
    missing = missing_extra()
    if missing:
        raise CommandError(
            f"the operator needs {' and '.join(missing)}, which this installation lacks: "
            "pip install 'schedlock[operator]' (the schedlock image has them, the "
            "schedlock-sidecar image does not)",
            EXIT_BAD_SETTING,
        )


def run(settings: OperatorSettings, _args: argparse.Namespace) -> int:
    from schedlock.operator.process import run as run_operator

    return asyncio.run(run_operator(settings))
