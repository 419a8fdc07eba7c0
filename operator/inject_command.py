"""``schedlock inject``: add the sidecar to manifests without a webhook (same code as the webhook).

    schedlock inject -f deployment.yaml | kubectl apply -f -
    helm template my-app ./chart | schedlock inject | kubectl apply -f -

Pods and workloads (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob) whose pod
template opts in with the label ``schedlock.dev/inject: "true"`` (the label the webhook selects
on) get the native sidecar; everything else passes through unchanged. A template that asks for
the sidecar but cannot have it (no target, a malformed annotation, a label value other than
``"true"``, or the annotation ``schedlock.dev/inject`` of 0.1 without the label) passes through
too, with a warning on stderr that says what to change.

Input that is not a stream of Kubernetes manifests (not YAML, not UTF-8, nested too deep to
read, or a field on the way to a pod template of the wrong shape, such as a list for
``metadata``) is refused as a whole: one line on stderr, exit status 2, nothing on stdout.

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

from schedlock.core.payloads import reason_of
from schedlock.core.settings import (
    EXIT_BAD_SETTING,
    CommandError,
    add_arguments,
    build,
    one_line,
)
from schedlock.operator.injection import (
    InjectionConfig,
    ManifestError,
    inject_manifest,
    json_type,
)
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
    documents = read_manifests(args.filename)
    warnings: list[str] = []
    try:
        out = [inject_document(doc, n, config, warnings) for n, doc in enumerate(documents, 1)]
        text = yaml.safe_dump_all(out, sort_keys=False)
    except RecursionError:  # the dumper recurses deeper per level than the loader
        raise _refused("a manifest is nested too deep to be written back") from None
    for warning in warnings:
        print(f"schedlock inject: warning: {one_line(warning)}", file=sys.stderr)
    sys.stdout.write(text)
    return 0


def read_manifests(filename: Path | None) -> list[Any]:
    """The YAML documents of the file (stdin: None), empty ones dropped; CommandError if the
    input cannot be read as YAML."""
    try:
        data = filename.read_bytes() if filename else sys.stdin.read()
    except OSError as exc:
        raise _refused(f"cannot read the manifests: {exc.strerror or exc}") from None
    except UnicodeDecodeError:  # stdin is text
        raise _refused("the manifests are not UTF-8 text") from None
    return parse_manifests(data)


def parse_manifests(data: bytes | str) -> list[Any]:
    """The YAML documents in ``data``, empty ones dropped; CommandError for anything else."""
    try:
        return [d for d in yaml.safe_load_all(data) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise _refused(f"the manifests are not YAML: {exc.problem or exc.context}{where}") from None
    except yaml.reader.ReaderError as exc:  # not UTF-8, or a character YAML forbids
        raise _refused(
            f"the manifests are not YAML text: {exc.reason} at position {exc.position}"
        ) from None
    except yaml.YAMLError as exc:
        raise _refused(f"the manifests are not YAML: {exc}") from None
    except RecursionError:
        raise _refused("the manifests are nested too deep to be read") from None
    except (ValueError, OverflowError) as exc:  # a scalar the constructor cannot make
        raise _refused(
            f"the manifests hold a value that cannot be read: {reason_of(exc)}"
        ) from None


def inject_document(doc: Any, number: int, config: InjectionConfig, warnings: list[str]) -> Any:
    """One YAML document with the sidecar where it opts in (a ``List``'s items each)."""
    if not isinstance(doc, dict):
        return doc
    try:
        if doc.get("kind") != "List":
            return inject_manifest(doc, config, warnings)
        items = doc.get("items")
        if items is not None and not isinstance(items, list):
            raise ManifestError(f"items is {json_type(items)}, not an array")
        result = []
        for n, item in enumerate(items or [], 1):
            try:
                result.append(
                    inject_manifest(item, config, warnings) if isinstance(item, dict) else item
                )
            except ManifestError as exc:
                raise ManifestError(f"item {n}: {exc}") from None
        return {**doc, "items": result}
    except ManifestError as exc:
        kind = doc.get("kind")
        shown = f" ({kind})" if isinstance(kind, str) and kind.isidentifier() else ""
        raise _refused(f"document {number}{shown}: {exc}") from None


def _refused(message: str) -> CommandError:
    return CommandError(message, EXIT_BAD_SETTING)
