"""``schedlock inject``: add the sidecar to manifests without a webhook (same code as the webhook).

    schedlock inject -f deployment.yaml | kubectl apply -f -
    helm template my-app ./chart | schedlock inject | kubectl apply -f -

Pods and workloads (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob) whose pod
template opts in with the annotation ``schedlock.dev/inject: "true"`` get the native sidecar;
everything else passes through unchanged. A template that asks for the sidecar but cannot have
it (no target, a malformed annotation) passes through too, with a warning on stderr.

Signing: ``--signing-secret NAME[/KEY]`` mounts that Secret's key (default key
``signing-secret``) into every injected sidecar as its HMAC key; a pod's own
``schedlock.dev/signing-secret`` annotation overrides it (an empty one turns it off).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from schedlock.core.settings import add_arguments, build
from schedlock.operator.injection import inject_manifest
from schedlock.operator.settings import InjectionSettings

# The operator's injection settings this command takes, under its own (shorter) flags.
FLAGS = {
    "sidecar_image": "--image",
    "sidecar_database_secret": "--database-secret",
    "sidecar_database_secret_key": "--database-secret-key",
    "sidecar_lease_seconds": "--lease-seconds",
    "sidecar_resources": "--resources",
    "sidecar_signing_secret": "--signing-secret",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inject",
        help="add the sidecar to manifests that opt in (for clusters without the webhook)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-f", "--filename", type=Path, help="manifest file (default: stdin)")
    add_arguments(parser, InjectionSettings, FLAGS)
    parser.set_defaults(command=command, command_name="inject")


def command(args: argparse.Namespace) -> int:
    # Flags only: the SCHEDLOCK_SIDECAR_* variables are the operator's, not this command's.
    config = build(InjectionSettings, args, environ={}, flags=FLAGS).injection
    try:
        text = args.filename.read_text() if args.filename else sys.stdin.read()
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except (OSError, yaml.YAMLError) as exc:
        print(f"schedlock inject: error: cannot read the manifests: {exc}", file=sys.stderr)
        return 2
    out: list[Any] = []
    warnings: list[str] = []
    for doc in documents:
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = [inject_manifest(i, config, warnings) for i in doc.get("items") or []]
            out.append({**doc, "items": items})
        elif isinstance(doc, dict):
            out.append(inject_manifest(doc, config, warnings))
        else:
            out.append(doc)
    for warning in warnings:
        print(f"schedlock inject: warning: {warning}", file=sys.stderr)
    yaml.safe_dump_all(out, sys.stdout, sort_keys=False)
    return 0
