"""No secret in any output, no control character in any log: what every output goes through.

A database URL is shown only as :func:`redact` makes it (the password and every secret query
parameter as ``***``), and every text that may quote one — a driver's error, a library's log
record, an app's answer — goes through a :class:`Scrubber` before it reaches a log, an error,
``/readyz`` or an Event.  :func:`printable` escapes what a terminal or a log viewer would act on.

The parser follows libpq's own (``fe-connect.c``: ``conninfo_uri_parse_options``,
``conninfo_uri_parse_params``, ``conninfo_uri_decode``, ``conninfo_parse``), so what it calls the
password is what libpq sends as the password:

* ``postgresql://`` and ``postgres://`` URIs: ``user[:password]@`` is what comes before the first
  ``@`` when no ``/`` comes first; then ``host[:port]`` pairs separated by ``,`` (``[v6]`` in
  brackets); ``/dbname``; ``?key=value&…``, exactly one ``=`` each.  Every part is
  percent-decoded: ``%`` must start two hex digits, and ``%00`` is refused.
* keyword/value strings (``host=db password='it\\'s'``): blanks around ``=``; a value is quoted
  with ``'`` (a backslash escapes any character) or runs to the next blank.
* any other ``scheme://`` URL (``mysql://``, ``https://``): the userinfo's password, and every
  query or fragment parameter whose name says it is secret.

Invariants: nothing here raises on any input, and an input that does not parse is never echoed:
it is shown as "the URL could not be parsed" with the reason in words.  Where libpq would read
another string than the user wrote — an ``@`` or ``/`` in the user name or password not
percent-encoded makes libpq take part of the password for a host, a port or a database name, and
quote it in its errors — the URL is refused as unparsable, so libpq never sees it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, quote_plus, unquote_to_bytes

MASK = "***"
NOT_PARSED = "the URL could not be parsed"

# libpq's connection keywords (PostgreSQL 18); the ones its own conninfo listing marks as
# secret or debug-only, plus the SCRAM keys, are never shown.  A keyword libpq does not know
# (a newer libpq's, or a typo libpq refuses) has its value masked too: it could be anything.
LIBPQ_KEYWORDS = frozenset(
    {
        "application_name",
        "channel_binding",
        "client_encoding",
        "connect_timeout",
        "dbname",
        "fallback_application_name",
        "gssdelegation",
        "gssencmode",
        "gsslib",
        "host",
        "hostaddr",
        "keepalives",
        "keepalives_count",
        "keepalives_idle",
        "keepalives_interval",
        "krbsrvname",
        "load_balance_hosts",
        "max_protocol_version",
        "min_protocol_version",
        "oauth_client_id",
        "oauth_client_secret",
        "oauth_issuer",
        "oauth_scope",
        "options",
        "passfile",
        "password",
        "port",
        "replication",
        "require_auth",
        "requirepeer",
        "requiressl",
        "scram_client_key",
        "scram_server_key",
        "service",
        "ssl",
        "ssl_max_protocol_version",
        "ssl_min_protocol_version",
        "sslcert",
        "sslcertmode",
        "sslcompression",
        "sslcrl",
        "sslcrldir",
        "sslkey",
        "sslkeylogfile",
        "sslmode",
        "sslnegotiation",
        "sslpassword",
        "sslrootcert",
        "sslsni",
        "target_session_attrs",
        "tcp_user_timeout",
        "user",
    }
)
LIBPQ_SECRETS = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)
# A parameter of any other URL, or a key=value in a free text, is secret when its name says so.
_SECRET_NAME = re.compile(
    r"pass|pwd|secret|token|credential|api_?key|private_?key|access_?key|client_?key|"
    r"server_?key|signature|authorization|^sig$|^pw$",
    re.IGNORECASE,
)
# The shortest known secret scrubbed out of free texts: a shorter one would mask ordinary words
# in every line (and a two-character password protects nothing).  Shown URLs mask any length.
MIN_SCRUBBED = 3

SCHEME_NAME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")  # RFC 3986
_SCHEME = re.compile(f"{SCHEME_NAME.pattern}://")
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_LIBPQ_BLANK = " \t\n\v\f\r"  # C isspace() in libpq's "C" locale parsing

# What a terminal, a log viewer or a line-oriented log collector acts on: C0 and C1 controls,
# DEL, lone surrogates (unencodable: the log write itself would fail), and the invisible
# direction and line-separator marks that make a line read as something it is not.
_BEYOND_C0 = "\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufeff"
_UNPRINTABLE = re.compile(f"[\x00-\x1f{_BEYOND_C0}]")
# What json.dumps(ensure_ascii=False) writes as it is (it escapes C0 only), though a terminal
# acts on it or the write cannot encode it (a lone surrogate).
_JSON_UNSAFE = re.compile(f"[{_BEYOND_C0}]")
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every control character escaped (``\\x1b``, ``\\n``, ``\\u202e``), cut to
    at most ``limit`` characters (ending in ``…`` when cut, never inside an escape)."""
    escaped = _UNPRINTABLE.sub(lambda m: _escape(m.group(0)), text)
    if limit is None or len(escaped) <= limit:
        return escaped
    out: list[str] = []
    used = 0
    for char in text:
        piece = _escape(char) if _UNPRINTABLE.fullmatch(char) else char
        if used + len(piece) > limit - 1:
            break
        out.append(piece)
        used += len(piece)
    return "".join(out) + "…"


def json_printable(line: str) -> str:
    """A JSON text with those characters as ``\\u`` escapes: still valid JSON, the same
    value once parsed."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", line)


def secret_name(name: str) -> bool:
    """Whether a parameter called ``name`` holds a secret (by libpq's list, or by its name)."""
    lowered = name.strip().lower()
    return lowered in LIBPQ_SECRETS or _SECRET_NAME.search(lowered) is not None


@dataclass(frozen=True)
class Redaction:
    """What :func:`inspect` found: the form to show, why it does not parse, and its secrets."""

    shown: str  # safe to print: secrets as ***, or "the URL could not be parsed (why)"
    problem: str | None = None  # why libpq would refuse it, or misread it (None: it parses)
    secrets: frozenset[str] = field(default_factory=frozenset)  # every spelling of each secret


class _Unparsable(ValueError):
    """The reason, in words that quote nothing of the input."""


def inspect(raw: str) -> Redaction:
    """Parse a database URL, a libpq connection string or any URL as the client would."""
    try:
        if _SCHEME.match(raw) is None:
            return _keyword_form(raw)
        scheme = raw.split(":", 1)[0].lower()
        if scheme in ("postgresql", "postgres"):
            return _libpq_uri(raw)
        return _other_url(raw)
    except _Unparsable as exc:
        why = f"{NOT_PARSED} ({exc})"
        return Redaction(shown=why, problem=why, secrets=frozenset(_suspects(raw)))
    except Exception:  # the invariant: never raise, whatever the input
        why = f"{NOT_PARSED}"
        return Redaction(shown=why, problem=why, secrets=frozenset(_suspects(raw)))


def redact(raw: str) -> str:
    """The URL or connection string as it may be shown anywhere."""
    return inspect(raw).shown


def secrets_of(*sources: str) -> frozenset[str]:
    """Every spelling of every secret the URLs or connection strings hold."""
    found: set[str] = set()
    for source in sources:
        if source:
            found |= inspect(source).secrets
    return frozenset(found)


# -- libpq URIs -------------------------------------------------------------------------------


def _first(text: str, stops: str, start: int = 0) -> int:
    """Index of the first character of ``stops`` in ``text`` from ``start`` (len if none)."""
    for index in range(start, len(text)):
        if text[index] in stops:
            return index
    return len(text)


def _decode(part: str, what: str) -> str:
    """libpq's percent-decoding of one part, or why it refuses it.  libpq 17 and later trim
    the part's spaces and refuse one inside it (quoting the part, so a password)."""
    part = part.strip(" ")
    if " " in part:
        raise _Unparsable(f"a space in the {what}: write it as %20")
    if _BAD_PERCENT.search(part):
        raise _Unparsable(f"invalid percent-encoding in the {what}: '%' must start two hex digits")
    data = unquote_to_bytes(part)
    if b"\x00" in data:
        raise _Unparsable(f"%00 in the {what}: libpq refuses a NUL byte")
    return data.decode("utf-8", "replace")


_UNENCODED = (
    "an '@' or '/' in the user name or password is not percent-encoded: write them as %40 and %2F"
)


def _libpq_uri(raw: str) -> Redaction:
    if not raw.startswith(("postgresql://", "postgres://")):
        # libpq takes any other spelling for a keyword/value string, and quotes it whole
        raise _Unparsable("the scheme must be written in lower case: postgresql://")
    scheme, rest = raw.split("://", 1)
    secrets: set[str] = set()
    shown = f"{scheme}://"
    pos = 0
    cut = _first(rest, "@/")
    if cut < len(rest) and rest[cut] == "@":
        user, colon, password = rest[:cut].partition(":")
        _decode(user, "user name")
        if colon:
            secrets |= _spellings(password, _decode(password, "password"))
        shown += _show(user) + (f":{MASK}" if colon else "") + "@"
        pos = cut + 1
    if "@" in rest[pos : _first(rest, "?", pos)]:
        raise _Unparsable(_UNENCODED)
    hosts: list[str] = []
    while True:
        if rest[pos : pos + 1] == "[":
            close = rest.find("]", pos + 1)
            if close < 0:
                raise _Unparsable("no ']' closes the IPv6 address")
            if close == pos + 1:
                raise _Unparsable("an empty IPv6 address")
            _decode(rest[pos + 1 : close], "host")
            host, pos = rest[pos : close + 1], close + 1
            if pos < len(rest) and rest[pos] not in ":/?,":
                raise _Unparsable("a character after the IPv6 address where ':' or '/' belongs")
        else:
            end = _first(rest, ":/?,", pos)
            host, pos = rest[pos:end], end
            _decode(host, "host")
        if rest[pos : pos + 1] == ":":
            end = _first(rest, "/?,", pos + 1)
            port = rest[pos + 1 : end]
            if not re.fullmatch("[0-9]*", _decode(port, "port")):
                # libpq would refuse it at connect time, quoting it (part of a password?)
                raise _Unparsable("a port that is not a number")
            host, pos = f"{host}:{port}", end
        hosts.append(_show(host))
        if rest[pos : pos + 1] != ",":
            break
        pos += 1
    shown += ",".join(hosts)
    if rest[pos : pos + 1] == "/":
        end = _first(rest, "?", pos + 1)
        _decode(rest[pos + 1 : end], "database name")
        shown += "/" + _show(rest[pos + 1 : end])
        pos = end
    if pos < len(rest):  # at the '?'
        params, found = _libpq_params(rest[pos + 1 :])
        secrets |= found
        shown += "?" + params
    return Redaction(shown=shown, secrets=frozenset(secrets))


def _libpq_params(query: str) -> tuple[str, set[str]]:
    shown: list[str] = []
    secrets: set[str] = set()
    for segment in _segments(query):
        if "=" not in segment:
            raise _Unparsable("a query parameter without '='")
        if segment.count("=") > 1:
            raise _Unparsable("a query parameter with a second '=' (percent-encode it as %3D)")
        key, value = segment.split("=")
        name = _decode(key, "query parameter name")
        decoded = _decode(value, "query parameter value")
        if "@" in key or ("@" in value and name not in LIBPQ_KEYWORDS):
            # `user=me@server` is a user name; anywhere else, the tail of a password
            raise _Unparsable(_UNENCODED)
        if name in LIBPQ_KEYWORDS and name not in LIBPQ_SECRETS:
            shown.append(f"{_show(key)}={_show(value)}")
            continue
        # a secret, or a keyword libpq does not know: its value could be anything
        secrets |= _spellings(value, decoded)
        shown.append(f"{_show(key)}={MASK}")
    return "&".join(shown), secrets


def _segments(query: str) -> list[str]:
    """libpq's split at ``&``: a trailing ``&`` ends the list, an empty segment elsewhere is an
    error (of a parameter without ``=``)."""
    segments = query.split("&")
    if len(segments) > 1 and segments[-1] == "":
        segments.pop()
    return [] if segments == [""] else segments


# -- keyword/value strings --------------------------------------------------------------------


def _keyword_form(raw: str) -> Redaction:
    shown: list[str] = []
    secrets: set[str] = set()
    pos, end = 0, len(raw)
    while pos < end:
        if raw[pos] in _LIBPQ_BLANK:
            pos += 1
            continue
        start = pos
        while pos < end and raw[pos] != "=" and raw[pos] not in _LIBPQ_BLANK:
            pos += 1
        name = raw[start:pos]
        while pos < end and raw[pos] in _LIBPQ_BLANK:
            pos += 1
        if pos >= end or raw[pos] != "=":
            raise _Unparsable("a word without '=' after it: neither a URL nor key=value pairs")
        pos += 1
        while pos < end and raw[pos] in _LIBPQ_BLANK:
            pos += 1
        value, written, pos = _keyword_value(raw, pos)
        if name == "dbname" and ("=" in value or _SCHEME.match(value)):
            # libpq expands a dbname that is itself a connection string or a URI
            inner = inspect(value)
            if inner.problem is not None:
                raise _Unparsable("the dbname holds a connection string that does not parse")
            secrets |= inner.secrets
            shown.append(f"dbname={_quoted(inner.shown)}")
        elif name in LIBPQ_KEYWORDS and name not in LIBPQ_SECRETS:
            shown.append(f"{_show(name)}={_show(written)}")
        else:
            secrets |= _spellings(written, value)
            shown.append(f"{_show(name)}={MASK}")
    if not shown:
        raise _Unparsable("it is empty")
    return Redaction(shown=" ".join(shown), secrets=frozenset(secrets))


def _keyword_value(raw: str, pos: int) -> tuple[str, str, int]:
    """One value from ``pos``: (its value, as written, the position after it)."""
    start, end = pos, len(raw)
    value: list[str] = []
    if raw[pos : pos + 1] != "'":
        while pos < end and raw[pos] not in _LIBPQ_BLANK:
            if raw[pos] == "\\":
                pos += 1
                if pos < end:
                    value.append(raw[pos])
                    pos += 1
            else:
                value.append(raw[pos])
                pos += 1
        return "".join(value), raw[start:pos], pos
    pos += 1
    while True:
        if pos >= end:
            raise _Unparsable("a quoted value without its closing quote")
        if raw[pos] == "\\":
            pos += 1
            if pos < end:
                value.append(raw[pos])
                pos += 1
            continue
        if raw[pos] == "'":
            pos += 1
            return "".join(value), raw[start:pos], pos
        value.append(raw[pos])
        pos += 1


def _quoted(value: str) -> str:
    """A keyword value as libpq reads it back (quoted when it has blanks or quotes)."""
    if value and not any(c in value for c in _LIBPQ_BLANK + "'\\"):
        return _show(value)
    return "'" + _show(value.replace("\\", "\\\\").replace("'", "\\'")) + "'"


# -- any other URL ----------------------------------------------------------------------------


def _other_url(raw: str) -> Redaction:
    """``scheme://[user[:password]@]host/path?query#fragment`` as RFC 3986 reads it, except that
    the userinfo runs to the last ``@`` before the query: a password with an unencoded ``/``
    or ``@`` is still masked whole (more is masked than needed, never less)."""
    scheme, rest = raw.split("://", 1)
    secrets: set[str] = set()
    before_query = _first(rest, "?#")
    at = rest.rfind("@", 0, before_query)
    shown = f"{scheme}://"
    if at >= 0:
        user, colon, password = rest[:at].partition(":")
        if colon:
            secrets |= _spellings(password, _lenient_decode(password))
        shown += _show(user) + (f":{MASK}" if colon else "") + "@"
    shown += _show(rest[at + 1 : before_query])
    tail = rest[before_query:]
    while tail:  # "?query" then "#fragment", each of & or ; separated parameters
        mark, tail = tail[0], tail[1:]
        end = tail.find("#") if mark == "?" else -1
        part, tail = (tail, "") if end < 0 else (tail[:end], tail[end:])
        params = []
        for param in re.split(r"([&;])", part):
            key, eq, value = param.partition("=")
            if eq and secret_name(_lenient_decode(key)):
                secrets |= _spellings(value, _lenient_decode(value))
                params.append(f"{_show(key)}={MASK}")
            else:
                params.append(_show(param))
        shown += mark + "".join(params)
    return Redaction(shown=shown, secrets=frozenset(secrets))


def _lenient_decode(part: str) -> str:
    return unquote_to_bytes(part).decode("utf-8", "replace")


# -- spellings of a secret, and the scrubber ----------------------------------------------------


def _spellings(written: str, value: str) -> set[str]:
    """A secret as written, as decoded, and as encoders and error messages spell it."""
    spellings = {written, value}
    encoded = quote(value, safe="")
    spellings |= {
        encoded,
        re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), encoded),
        quote(value, safe="!$&'()*+,;=:~"),  # what a userinfo encoder leaves as is
        quote_plus(value),
        value.replace("\\", "\\\\").replace("'", "\\'"),  # psycopg's make_conninfo quoting
    }
    for text in (written, value):  # as Python, JSON and our own logs quote either
        spellings |= {
            repr(text)[1:-1],
            json.dumps(text)[1:-1],
            json.dumps(text, ensure_ascii=False)[1:-1],
            printable(text),
        }
    return {s for s in spellings if s}


def _suspects(raw: str) -> set[str]:
    """What may be a secret in a string that does not parse: everything between the first
    ``:`` after ``//`` and the last ``@``, any keyword value after a secret name, and the
    string itself.  It is never shown, so these only scrub texts that might quote it."""
    suspects = _spellings(raw, _lenient_decode(raw))
    _, slashes, rest = raw.partition("//")
    if slashes:
        colon, at = rest.find(":"), rest.rfind("@")
        if 0 <= colon < at:
            piece = rest[colon + 1 : at]
            suspects |= _spellings(piece, _lenient_decode(piece))
    for match in _FREE_PAIR.finditer(raw):
        if secret_name(match.group("key")):
            value = match.group("value").strip("'\"")
            suspects |= _spellings(value, _lenient_decode(value))
    return suspects


def _show(part: str) -> str:
    """A part of a URL as shown: printable, and masked where it reads as a secret pair (libpq
    reads ``host= password=x`` as the host ``password=x``)."""
    return printable(_FREE_PAIR.sub(_mask_pair, part))


# A URL with a userinfo: the password runs to the last '@' of the token (over-masking is safe).
_FREE_USERINFO = re.compile(r"(?P<lead>[A-Za-z][A-Za-z0-9+.-]*://[^\s:/?#@'\"<>]*):[^\s'\"<>]*@")
# A key=value in a text (a conninfo, a query, a form body): the value is a quoted string or
# runs to a blank, or to '&' / '#' inside a URL's query.
_FREE_PAIR = re.compile(
    r"(?P<sep>^|[\s?&;#,(=\"'])(?P<key>[A-Za-z_][\w.-]*)\s*=\s*"
    r"(?P<value>'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&#]+)"
)


def _mask_pair(match: re.Match[str]) -> str:
    if not secret_name(match.group("key")):
        return match.group(0)
    return f"{match.group('sep')}{match.group('key')}={MASK}"


class Scrubber:
    """Takes secrets out of free texts: the known ones (every spelling of a URL's password),
    and whatever looks like a password in a URL or a secret ``key=value`` pair."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        known = sorted({s for s in secrets if len(s) >= MIN_SCRUBBED}, key=len, reverse=True)
        self._known = re.compile("|".join(map(re.escape, known))) if known else None

    def __call__(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(MASK, text)
        text = _FREE_USERINFO.sub(lambda m: f"{m.group('lead')}:{MASK}@", text)
        return _FREE_PAIR.sub(_mask_pair, text)


def scrub(text: str, *sources: str) -> str:
    """``text`` without the secrets of the URLs or connection strings ``sources``, nor any
    password-looking part of a URL or ``key=value`` pair it quotes."""
    return Scrubber(secrets_of(*sources))(text)
