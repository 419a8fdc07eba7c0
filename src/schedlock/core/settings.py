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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

EXIT_BAD_SETTING = 2
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


class SettingError(ValueError):
    """A setting has a value the process cannot run with."""

    def __init__(self, spec: SettingSpec | None, message: str) -> None:
        self.spec = spec
        self.message = message
        where = f"{spec.flag} / {spec.env}: " if spec is not None else ""
        super().__init__(f"{where}{message}")


@dataclass(frozen=True)
class SettingSpec:
    """How one setting is spelled on the command line and in the environment."""

    flag: str
    env: str
    help: str
    parse: Callable[[str], Any]
    unit: str = ""
    secret: bool = False


def setting(
    *,
    env: str,
    help: str,
    default: Any,
    parse: Callable[[str], Any],
    flag: str | None = None,
    unit: str = "",
    secret: bool = False,
) -> Any:
    """Declare a settings field; ``flag`` defaults to ``--`` + the env name's tail in kebab case."""
    if flag is None:
        flag = "--" + env.removeprefix("SCHEDLOCK_").lower().replace("_", "-")
    spec = SettingSpec(flag=flag, env=env, help=help, parse=parse, unit=unit, secret=secret)
    return field(default=default, metadata={"setting": spec})


def log_level_setting() -> Any:
    """``SCHEDLOCK_LOG_LEVEL``, the same for every process."""
    return setting(
        env="SCHEDLOCK_LOG_LEVEL",
        help="log level",
        default="info",
        parse=choice("debug", "info", "warning", "error"),
    )


def log_format_setting() -> Any:
    """``SCHEDLOCK_LOG_FORMAT``, the same for every process."""
    return setting(
        env="SCHEDLOCK_LOG_FORMAT",
        help="json (one object per line) or text",
        default="json",
        parse=choice("json", "text"),
    )


def specs(cls: type[Any]) -> list[tuple[dataclasses.Field[Any], SettingSpec]]:
    """The settings fields of a settings dataclass, in declaration order."""
    return [(f, f.metadata["setting"]) for f in dataclasses.fields(cls) if "setting" in f.metadata]


def add_arguments(parser: argparse.ArgumentParser, cls: type[Any]) -> None:
    """Add one ``--flag`` per setting, documenting env var, unit and default in the help."""
    for f, spec in specs(cls):
        default = f.default
        shown = "unset" if default in (None, "") else ("***" if spec.secret else str(default))
        unit = f" [{spec.unit}]" if spec.unit else ""
        parser.add_argument(
            spec.flag,
            dest=f.name,
            default=None,
            metavar=spec.unit.upper().replace(" ", "_") or "VALUE",
            help=f"{spec.help}{unit} (env {spec.env}; default: {shown})",
        )


def build(
    cls: type[T], args: argparse.Namespace | None, environ: Mapping[str, str] | None = None
) -> T:
    """Resolve every setting (flag > env > default), parse, then run ``cls.validate``."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for f, spec in specs(cls):
        raw = getattr(args, f.name, None) if args is not None else None
        if raw is None:
            raw = environ.get(spec.env)
        if raw is None or (raw == "" and f.default is not None):
            continue  # keep the default
        try:
            values[f.name] = spec.parse(raw)
        except SettingError as exc:
            raise SettingError(spec, exc.message) from None
        except ValueError as exc:
            raise SettingError(spec, str(exc)) from None
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if validate is not None:
        validate()
    return instance


def spec_of(cls: type[Any], name: str) -> SettingSpec:
    """The spec of one field, for cross-field errors raised by ``validate``."""
    for f, spec in specs(cls):
        if f.name == name:
            return spec
    raise KeyError(name)


# --- parsers: each raises ValueError with a message that says what is allowed -------------------


def integer(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"must be a whole number from {low} to {high}, got {raw!r}") from None
        if not low <= value <= high:
            raise ValueError(f"must be a whole number from {low} to {high}, got {value}")
        return value

    return parse


def number(low: float, high: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ValueError(f"must be a number from {low:g} to {high:g}, got {raw!r}") from None
        if not math.isfinite(value) or not low <= value <= high:
            raise ValueError(f"must be a number from {low:g} to {high:g}, got {raw.strip()}")
        return value

    return parse


def choice(*allowed: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}, got {raw!r}")
        return value

    return parse


def dns_label(raw: str) -> str:
    value = raw.strip()
    if not DNS_LABEL.match(value):
        raise ValueError(
            "must be a DNS label (lowercase letters, digits and '-', 1-63 characters, "
            f"starting and ending with a letter or digit), got {raw!r}"
        )
    return value


def http_url(raw: str) -> str:
    value = raw.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL with a host, got {raw!r}")
    return value


def check_url(raw: str) -> str:
    """A readiness check: ``http(s)://host[:port]/path`` (GET) or ``tcp://host:port`` (connect)."""
    value = raw.strip()
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = -1
    if port != -1 and parts.hostname:
        if parts.scheme in ("http", "https"):
            return value
        if parts.scheme == "tcp" and port and parts.path in ("", "/") and not parts.query:
            return value
    raise ValueError(
        f"must be an http:// or https:// URL to GET, or tcp://host:port to connect to, got {raw!r}"
    )


def database_url(raw: str) -> str:
    """``postgresql://…``/``postgres://…`` or ``sqlite:///path`` (not ``sqlite:///:memory:``)."""
    value = raw.strip()
    scheme = value.split(":", 1)[0].lower()
    if scheme in ("postgresql", "postgres"):
        return value
    if scheme == "sqlite":
        if not value.startswith("sqlite:///") or value == "sqlite:///" or ":memory:" in value:
            raise ValueError(
                "sqlite URLs look like sqlite:///relative/path.db or sqlite:////abs/path.db"
            )
        return value
    redacted = re.sub(r"//[^@/]*@", "//***@", value)
    raise ValueError(f"must be a postgresql://… or sqlite:///path URL, got {redacted!r}")


_HOST = re.compile(r"^[A-Za-z0-9.:-]{1,253}$")


def host(raw: str) -> str:
    value = raw.strip()
    if not _HOST.match(value):
        raise ValueError(f"must be a host name or IP address to bind to, got {raw!r}")
    return value


def readable_file(raw: str) -> Path:
    path = Path(raw.strip())
    if not path.is_file():
        raise ValueError(f"must name a readable file, {str(path)!r} does not exist")
    try:
        path.read_bytes()
    except OSError as exc:
        raise ValueError(f"must name a readable file, {str(path)!r}: {exc.strerror}") from None
    return path


def text(max_len: int = 253) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if not value or len(value) > max_len or any(ord(c) < 32 for c in value):
            raise ValueError(f"must be 1 to {max_len} printable characters, got {raw!r}")
        return value

    return parse
