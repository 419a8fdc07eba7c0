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

from schedlock.operator.injection import (
    InjectionConfig,
    inject_manifest,
    parse_resources,
    parse_signing_secret,
)
from schedlock.operator.settings import DEFAULT_IMAGE


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "inject",
        help="add the sidecar to manifests that opt in (for clusters without the webhook)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-f", "--filename", type=Path, help="manifest file (default: stdin)")
    parser.add_argument(
        "--image", default=DEFAULT_IMAGE, help=f"sidecar image (default {DEFAULT_IMAGE})"
    )
    parser.add_argument(
        "--database-secret",
        default="schedlock-database",
        help="Secret with the database URL in the app's namespace",
    )
    parser.add_argument("--database-secret-key", default="url", help="key in that Secret")
    parser.add_argument("--lease-seconds", type=float, default=10.0, help="sidecar lease")
    parser.add_argument(
        "--resources", default=None, metavar="JSON", help="sidecar container resources as JSON"
    )
    parser.add_argument(
        "--signing-secret",
        default="",
        metavar="NAME[/KEY]",
        help="Secret (in the app's namespace) whose KEY (default signing-secret) signs the "
        "deliveries; default: no signing unless the pod's schedlock.dev/signing-secret says so",
    )
    parser.set_defaults(command=command, command_name="inject")


def command(args: argparse.Namespace) -> int:
    try:
        resources = parse_resources(args.resources) if args.resources else None
    except ValueError as exc:
        print(f"schedlock inject: error: --resources: {exc}", file=sys.stderr)
        return 2
    try:
        signing_secret = parse_signing_secret(args.signing_secret)
    except ValueError as exc:
        print(f"schedlock inject: error: --signing-secret: {exc}", file=sys.stderr)
        return 2
    config = InjectionConfig(
        image=args.image,
        database_secret=args.database_secret,
        database_secret_key=args.database_secret_key,
        lease_seconds=args.lease_seconds,
        signing_secret=signing_secret,
        **({"resources": resources} if resources else {}),
    )
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
