"""Typed process settings built once from flags and environment variables.

Every setting is a dataclass field declared with :func:`setting`: its flag, its environment
variable, its unit and default and why it exists live next to each other, and ``--help`` is
generated from them.  Precedence: command-line flag, then environment variable, then default.

A bad value is a :class:`SettingError` naming the flag, the variable and what is allowed; the CLI
prints it as one line and exits with status 2 — never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import SplitResult, urlsplit

from schedlock.core import logs, redact

T = TypeVar("T")
N = TypeVar("N", int, float)

EXIT_FAILED = 1
EXIT_BAD_SETTING = 2
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class CommandError(Exception):
    """A command cannot go on. The CLI's ``main`` alone prints it: one line, then ``code``."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def one_line(message: str) -> str:
    """A message as one printable line: line breaks become spaces, other unprintable characters
    their escapes, so text from a database or a file can neither add lines nor drive the
    terminal (ESC, BEL)."""
    return "".join(
        c if c.isprintable() else " " if c in "\r\n\t" else repr(c)[1:-1] for c in message
    )


class SettingError(CommandError, ValueError):
    """A setting has a value the process cannot run with (exit status 2)."""

    def __init__(self, spec: SettingSpec | None, message: str) -> None:
        self.spec = spec
        self.message = message
        where = (
            "" if spec is None else f"{spec.flag} / {spec.env}: " if spec.env else f"{spec.flag}: "
        )
        super().__init__(f"{where}{message}", EXIT_BAD_SETTING)


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is spelled on the command line and in the environment."""

    flag: str
    env: str
    help: str
    parse: Callable[[str], Any]
    unit: str = ""
    secret: bool = False
    shown: str | None = None


def setting(
    env: str,
    default: Any,
    parse: Callable[[str], Any],
    unit: str = "",
    *,
    help: str,
    flag: str | None = None,
    secret: bool = False,
    shown: str | None = None,
) -> Any:
    """Declare a settings field: its variable, default, parser and unit, then what it is for.

    ``flag`` defaults to ``--`` + the env name's tail in kebab case; ``shown`` is the default as
    ``--help`` states it when the value itself would not say it (a default derived at start).
    """
    if flag is None:
        flag = "--" + env.removeprefix("SCHEDLOCK_").lower().replace("_", "-")
    spec = SettingSpec(
        flag=flag, env=env, help=help, parse=parse, unit=unit, secret=secret, shown=shown
    )
    return field(default=default, metadata={"setting": spec})


def specs(
    cls: type[Any], flags: Mapping[str, str] | None = None
) -> list[tuple[dataclasses.Field[Any], SettingSpec]]:
    """The settings fields of a settings dataclass, in declaration order.

    ``flags`` (field name -> flag) picks some fields under other flags and without their
    variables: a command that takes them as plain flags (``schedlock inject``).
    """
    fields = [
        (f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata
    ]
    if flags is None:
        return fields
    return [(f, replace(spec, flag=flags[f.name], env="")) for f, spec in fields if f.name in flags]


def add_arguments(
    parser: argparse.ArgumentParser, cls: type[Any], flags: Mapping[str, str] | None = None
) -> None:
    """Add one ``--flag`` per setting, documenting env var, unit and default in the help."""
    for f, spec in specs(cls, flags):
        default = f.default
        shown = "unset" if default in (None, "") else ("***" if spec.secret else str(default))
        shown = spec.shown or shown
        unit = f" [{spec.unit}]" if spec.unit else ""
        env = f"env {spec.env}; " if spec.env else ""
        parser.add_argument(
            spec.flag,
            dest=f.name,
            default=None,
            metavar=spec.unit.upper().replace(" ", "_") or "VALUE",
            help=f"{spec.help}{unit} ({env}default: {shown})",
        )


def build(
    cls: type[T],
    args: argparse.Namespace | None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> T:
    """Resolve every setting (flag > env > default), parse, then run ``cls.validate``."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f, spec in specs(cls, flags):
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is None and spec.env:
            raw = environ.get(spec.env)
        if raw is None or (raw == "" and f.default is not None):
            continue  # keep the default
        try:
            values[f.name] = spec.parse(raw)
        except SettingError as exc:
            raise SettingError(spec, exc.message) from None
        except (ValueError, OverflowError, RecursionError) as exc:
            raise SettingError(spec, parse_failure(exc)) from None
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if validate is not None:
        validate()
    return instance


def secrets_in(settings: Any) -> frozenset[str]:
    """Every spelling of every secret in the URL and secret settings of a settings object,
    which its process's logs never show (``logs.configure``)."""
    found: set[str] = set()
    for f, spec in specs(type(settings)):
        value = getattr(settings, f.name)
        if isinstance(value, str) and value and (spec.unit == "url" or spec.secret):
            found |= redact.secrets_of(value)
    return frozenset(found)


def spec_of(cls: type[Any], name: str) -> SettingSpec:
    """The spec of one field, for cross-field errors raised by ``validate``."""
    for f, spec in specs(cls):
        if f.name == name:
            return spec
    raise KeyError(name)


def flag_value(flag: str, raw: str, parse: Callable[[str], T]) -> T:
    """Parse a plain command-line flag (one without a variable); a bad value is a SettingError."""
    try:
        return parse(raw)
    except SettingError as exc:
        raise SettingError(None, f"{flag}: {exc.message}") from None
    except (ValueError, OverflowError, RecursionError) as exc:
        raise SettingError(None, f"{flag}: {parse_failure(exc)}") from None


def parse_failure(exc: ValueError | OverflowError | RecursionError) -> str:
    """What a parser's error says. The parsers here say what is allowed; an overflow or a
    recursion from deeper down (datetime, json, a library) is the value's size or depth, and
    its own text is not for people (``Python int too large to convert to C int``)."""
    if isinstance(exc, RecursionError):
        return "is nested too deep to be read"
    if isinstance(exc, OverflowError):
        return "is out of range"
    return str(exc)


def add_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    cls: type[T],
    run: Callable[[T, argparse.Namespace], int],
    *,
    summary: str,
    description: str = "",
    prerequisite: Callable[[], None] | None = None,
) -> argparse.ArgumentParser:
    """A subcommand whose flags are the settings of ``cls``: it builds them, then ``run``s.

    A service (sidecar, operator) configures its logging from its settings first. A bad
    setting raises SettingError, which the CLI prints as one line with exit status 2.
    ``prerequisite`` runs before any setting is read and raises CommandError when the command
    cannot run here at all (the operator without its extra). The parser is returned so a
    command can add arguments of its own.
    """
    if issubclass(cls, ServiceSettings):
        description += " Every flag can also be set by its SCHEDLOCK_* variable."
    parser = subparsers.add_parser(name, help=summary, description=description or None)
    add_arguments(parser, cls)

    def command(args: argparse.Namespace) -> int:
        if prerequisite is not None:
            prerequisite()
        settings = build(cls, args)
        if isinstance(settings, ServiceSettings):
            logs.configure(settings.log_level, settings.log_format, secrets_in(settings))
        return run(settings, args)

    parser.set_defaults(command=command, command_name=name)
    return parser


# --- parsers: each raises ValueError with a message that says what is allowed -------------------

SHOWN_CHARS = 64
SHOWN_PATH_CHARS = 256  # a file name is worth showing whole (they are at most 4096 bytes)


def quoted(raw: str, limit: int = SHOWN_CHARS) -> str:
    """A value as an error repeats it: quoted, its control characters escaped (the line stays
    one line), and cut to its first ``limit`` characters (a 100 KB value stays short)."""
    if len(raw) <= limit:
        return repr(raw)
    return f"{raw[:limit]!r}… ({len(raw)} characters)"


_INTEGER = re.compile(r"[-+]?[0-9]{1,30}")  # ASCII digits only: int() also takes "1_0", "١٢"


def _whole(raw: str) -> int:
    if not _INTEGER.fullmatch(raw):
        raise ValueError(raw)
    return int(raw)


def _bounded(convert: Callable[[str], N], kind: str, low: N, high: N) -> Callable[[str], N]:
    """A parser of ``kind`` values from ``low`` to ``high``; ``convert`` raises ValueError."""
    allowed = f"must be {kind} from {_shown(low)} to {_shown(high)}"

    def parse(raw: str) -> N:
        try:
            value = convert(raw.strip())
        except ValueError:
            raise ValueError(f"{allowed}, got {quoted(raw)}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"{allowed}, got {quoted(raw.strip())}")
        return value

    return parse


def _shown(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


def integer(low: int, high: int) -> Callable[[str], int]:
    return _bounded(_whole, "a whole number", low, high)


def number(low: float, high: float) -> Callable[[str], float]:
    return _bounded(float, "a number", low, high)


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {quoted(raw)}")
        return value

    return parse


def dns_label(raw: str) -> str:
    value = raw.strip()
    if not DNS_LABEL.match(value):
        raise ValueError(
            "must be a DNS label (lowercase letters, digits and '-', 1-63 characters, "
            f"starting and ending with a letter or digit), got {quoted(raw)}"
        )
    return value


MAX_URL_CHARS = 2048  # what browsers and proxies reliably pass; a longer one is a mistake


def _url_parts(raw: str, scheme: str) -> SplitResult | None:
    """The parts of a ``scheme`` URL with a host and, if any, a port from 1 to 65535, of at
    most ``MAX_URL_CHARS``; None for anything else.

    Refuses whitespace and control characters: ``urlsplit`` drops tabs and newlines silently,
    so the URL it checked would not be the one the process then uses.
    """
    if len(raw) > MAX_URL_CHARS or not raw.isprintable() or any(c.isspace() for c in raw):
        return None
    try:
        parts = urlsplit(raw)
        port = parts.port  # ValueError: not a number, or beyond 65535
    except ValueError:  # also an unclosed IPv6 bracket
        return None
    if parts.scheme != scheme or not parts.hostname or port == 0:
        return None
    return parts


def http_url(raw: str) -> str:
    """``http(s)://host[:port][/path]``, the port from 1 to 65535 (the target URL)."""
    value = raw.strip()
    scheme = value.split(":", 1)[0].lower()
    if scheme not in ("http", "https") or _url_parts(value, scheme) is None:
        raise ValueError(
            f"must be an http:// or https:// URL of at most {MAX_URL_CHARS} characters with a "
            f"host and, if it has one, a port from 1 to 65535, got {quoted(raw)}"
        )
    return value


def check_url(raw: str) -> str:
    """A readiness check: ``http(s)://host[:port]/path`` (GET) or ``tcp://host:port`` (connect)."""
    value = raw.strip()
    scheme = value.split(":", 1)[0].lower()
    parts = _url_parts(value, scheme) if scheme in ("http", "https", "tcp") else None
    if parts is not None and scheme != "tcp":
        return value
    if parts is not None and parts.port is not None and parts.path in ("", "/") and not parts.query:
        return value
    raise ValueError(
        "must be an http:// or https:// URL to GET, or tcp://host:port to connect to (a port "
        f"from 1 to 65535, at most {MAX_URL_CHARS} characters), got {quoted(raw)}"
    )


def database_url(raw: str) -> str:
    """``postgresql://…``/``postgres://…`` or ``sqlite:///path`` (not ``sqlite:///:memory:``).

    A URL libpq would refuse or misread is refused here, in words that never quote it; one that
    is not a database URL at all is quoted redacted (a keyword/value string, ``mysql://…``).
    """
    value = raw.strip()
    scheme, colon, rest = value.partition(":")
    scheme = scheme.lower() if colon and redact.SCHEME_NAME.fullmatch(scheme) else ""
    if scheme in ("postgresql", "postgres"):
        value = f"{scheme}:{rest}"  # libpq knows the scheme in lower case only
        if not rest.startswith("//"):
            raise ValueError(f"must be {scheme}://[user[:password]@]host[:port]/dbname")
        problem = redact.inspect(value).problem
        if problem is not None:
            raise ValueError(problem)
        return value
    if scheme == "sqlite":
        if not value.startswith("sqlite:///") or value == "sqlite:///" or ":memory:" in value:
            raise ValueError(
                "sqlite URLs look like sqlite:///relative/path.db or sqlite:////abs/path.db"
            )
        return value
    found = redact.inspect(value)
    got = "a value that is not one" if found.problem else repr(found.shown)
    raise ValueError(f"must be a postgresql://… or sqlite:///path URL, got {got}")


_HOST = re.compile(r"^[A-Za-z0-9.:-]{1,253}$")


def host(raw: str) -> str:
    value = raw.strip()
    if not _HOST.match(value):
        raise ValueError(f"must be a host name or IP address to bind to, got {quoted(raw)}")
    return value


def readable_file(raw: str) -> Path:
    path = Path(raw.strip())
    try:
        with path.open("rb") as file:
            file.read(1)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        reason = "does not exist" if isinstance(exc, FileNotFoundError) else _reason(exc)
        raise ValueError(
            f"must name a readable file, {quoted(str(path), SHOWN_PATH_CHARS)} {reason}"
        ) from None
    return path


def _reason(exc: OSError | ValueError) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot be read: {exc.strerror}"
    return "cannot be read"


def text(max_len: int = 253) -> Callable[[str], str]:
    """1 to ``max_len`` printable characters: no control, format (bidi overrides, zero-width)
    or surrogate characters, which would garble a log line or a terminal that shows them."""

    def parse(raw: str) -> str:
        value = raw.strip()
        if not value or len(value) > max_len or not value.isprintable():
            raise ValueError(f"must be 1 to {max_len} printable characters, got {quoted(raw)}")
        return value

    return parse


# --- the settings every process shares -----------------------------------------------------


def database_setting(help: str) -> Any:
    """``SCHEDLOCK_DATABASE_URL``: each process says what it needs the database for."""
    return setting("SCHEDLOCK_DATABASE_URL", "", database_url, "url", help=help, secret=True)


DEFAULT_SCHEMA = "schedlock"
_SCHEMA = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def schema_name(raw: str) -> str:
    """A PostgreSQL schema for schedlock's tables: a lower-case identifier that needs no
    quoting (as ``psql`` users type it), not ``pg_…`` (reserved) nor ``information_schema``."""
    value = raw.strip()
    if not _SCHEMA.match(value) or value.startswith("pg_") or value == "information_schema":
        raise ValueError(
            "must be a schema name of 1 to 63 lower-case letters, digits and underscores, "
            f"starting with a letter or underscore, not pg_… or information_schema, got "
            f"{quoted(raw)}"
        )
    return value


@dataclass(frozen=True)
class DatabaseSettings:
    """What every command that touches the database reads (``schedlock migrate`` and friends)."""

    database_url: str = database_setting("postgresql://… or sqlite:///path")
    database_schema: str = setting(
        "SCHEDLOCK_DATABASE_SCHEMA",
        DEFAULT_SCHEMA,
        schema_name,
        "name",
        help="PostgreSQL schema holding schedlock's tables (created by `schedlock migrate`); "
        "an install an earlier release made in `public` is used where it is while this schema "
        "holds none; the same value for every sidecar, the operator and the CLI; ignored for "
        "SQLite",
    )

    def validate(self) -> None:
        if not self.database_url:
            raise SettingError(spec_of(type(self), "database_url"), "is required")


@dataclass(frozen=True)
class ServiceSettings(DatabaseSettings):
    """What the long-running processes (sidecar, operator) share besides the database."""

    holder: str = setting(
        "SCHEDLOCK_HOLDER",
        "",
        text(63),
        help="this replica's name in the database (application_name; a sidecar's term "
        "holder); defaults to the pod or host name",
    )
    migrate: str = setting(
        "SCHEDLOCK_MIGRATE",
        "auto",
        choice("auto", "off"),
        help="auto: apply missing migrations at start; off: wait until an owner ran "
        "`schedlock migrate`",
    )
    log_level: str = setting(
        "SCHEDLOCK_LOG_LEVEL",
        "info",
        choice("debug", "info", "warning", "error"),
        help="log level",
    )
    log_format: str = setting(
        "SCHEDLOCK_LOG_FORMAT",
        "json",
        choice("json", "text"),
        help="json (one object per line) or text",
    )

    @property
    def holder_name(self) -> str:
        return self.holder or socket.gethostname()


DAY_SECONDS = 24 * 3600.0
MAX_RETENTION_SECONDS = 3650 * 24 * 3600  # ten years; a whole number, as --help and errors show it


@dataclass(frozen=True)
class RetentionSettings:
    """How long finished history is kept, for every process that may prune it (the sidecar and
    the operator: ``schedlock.store.retention``).  Give them all the same values (the chart
    sets both from ``retention.*``): whichever process holds the lease prunes by its own."""

    retention_seconds: float = setting(
        "SCHEDLOCK_RETENTION_SECONDS",
        DAY_SECONDS,
        number(0, MAX_RETENTION_SECONDS),
        "seconds",
        help="how long published and cancelled rows, cancelled schedules and the terms of "
        "keys no sidecar serves are kept after their last change before they are pruned; "
        "0 keeps them forever. With the operator, keep it longer than any operator outage: "
        "an outcome pruned before the operator recorded it in the object's status would be "
        "written again",
    )
    failed_retention_seconds: float = setting(
        "SCHEDLOCK_FAILED_RETENTION_SECONDS",
        7 * DAY_SECONDS,
        number(0, MAX_RETENTION_SECONDS),
        "seconds",
        help="how long failed and missed rows are kept (longer: they are what someone "
        "investigates); 0 keeps them forever",
    )
    prune_interval_seconds: float = setting(
        "SCHEDLOCK_PRUNE_INTERVAL_SECONDS",
        60.0,
        number(1, DAY_SECONDS),
        "seconds",
        help="how often the elected process prunes (one short database session each time); "
        "the others try for the election about once per three intervals",
    )
    prune_batch_size: int = setting(
        "SCHEDLOCK_PRUNE_BATCH_SIZE",
        1000,
        integer(10, 100_000),
        "rows",
        help="rows deleted per statement; each batch commits on its own and is followed by a "
        "pause as long as it took",
    )

    def retention_env(self) -> tuple[tuple[str, str], ...]:
        """These settings as (variable, value) pairs, for processes this one starts or injects."""
        return tuple(
            (spec.env, f"{getattr(self, f.name):g}") for f, spec in specs(RetentionSettings)
        )
