"""The ``schedlock`` command: one console script, a subcommand per capability.

Subcommands register here as the features behind them exist.  Every subcommand reads
``SCHEDLOCK_DATABASE_URL`` where it touches the database.  Exit codes: 0 success, 1 runtime
failure, 2 bad usage or configuration (one line on stderr, never a traceback).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from schedlock import __version__
from schedlock.core.settings import EXIT_BAD_SETTING, CommandError, one_line

Command = Callable[[argparse.Namespace], int]
Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

PROLOG = (
    "schedlock fires scheduled work once, on time, with millisecond failover, using PostgreSQL "
    "advisory locks. Run `schedlock COMMAND --help` for the settings of a command; every "
    "setting can also come from its SCHEDLOCK_* environment variable."
)


# Commands whose module registers them alone, by the name a command line starts with.  Running
# one of them imports that module only: the sidecar, in every pod, never loads the operator's
# modules or the admin commands (tests/unit/test_packaging.py guards it).
ALONE = {
    "sidecar": "schedlock.sidecar.process",
    "operator": "schedlock.operator.command",
    "inject": "schedlock.operator.inject_command",
}


def _registrars(command: str | None = None) -> list[Registrar]:
    """Subcommand registrars, in the order ``--help`` lists them; only ``command``'s when it is
    one of ``ALONE`` (the others are then never imported)."""
    if command in ALONE:
        module = importlib.import_module(ALONE[command])
        return [module.add_parser]
    from schedlock.cli import admin
    from schedlock.operator import command as operator_command
    from schedlock.operator import inject_command
    from schedlock.sidecar import process as sidecar_process

    return [
        sidecar_process.add_parser,
        operator_command.add_parser,
        inject_command.add_parser,
        admin.add_parsers,
    ]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="schedlock",
        description=PROLOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"schedlock {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for register in _registrars(command):
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words[0] if words else None)
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command", None)
    if command is None:
        parser.print_help()
        return EXIT_BAD_SETTING if argv is None and len(sys.argv) > 1 else 0
    try:
        return command(args)
    except CommandError as exc:
        print(f"schedlock {args.command_name}: error: {one_line(str(exc))}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
