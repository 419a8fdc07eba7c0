"""Delivery of one fire to the app: an HTTP POST on localhost, bounded in time and memory.

Request: ``POST <target-url>`` with a JSON body (id, uid, namespace, name, target, scheduledAt,
attempt, term, holder, payload) and the headers

* ``Idempotency-Key`` — stable per row and scheduled time, identical on every retry and
  re-fire, so the app can drop duplicates;
* ``X-Schedlock-Term`` and ``X-Schedlock-Attempt``;
* ``X-Schedlock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` when a
  signing secret is configured.

The response body is read up to 4 KiB (for the error text), and to its end only when it is at
most 64 KiB, which keeps the connection for the next delivery (a longer one is dropped instead);
redirects are not followed and the whole call is bounded by the request timeout, so a hostile
or broken app costs bounded time and memory.
Classification into success / retryable / permanent is pure (``schedlock.core.scheduling.classify``).

A call that got no HTTP answer because the connection could not be made or was cut (refused,
reset, closed before the status line) is flagged ``connection_lost``: the app may be gone, which
``schedlock.sidecar.target`` confirms before the row's attempt is counted.  A timeout is not:
the app accepted the request and is slow, which is the app's answer as far as retries go.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from schedlock import __version__
from schedlock.core.aio import utcnow
from schedlock.core.httpio import (
    CannotConnect,
    CannotSend,
    Disconnected,
    HttpClient,
    HttpFailure,
)
from schedlock.core.identities import rfc3339
from schedlock.core.redact import printable, scrub
from schedlock.core.scheduling import AttemptResult, idempotency_key
from schedlock.store import FireRow

MAX_ERROR_BODY = 4096
MAX_REUSED_BODY = 64 * 1024
SIGNATURE_HEADER = "X-Schedlock-Signature"


@dataclass(frozen=True)
class Delivery:
    """One delivery's result, and whether it failed for want of a connection to the app."""

    attempt: AttemptResult
    connection_lost: bool = False


def error_text(text: str, limit: int) -> str:
    """An app's answer or a client error as ``last_error`` keeps it (and the row's Events and
    the logs show it): printable, bounded, and without a URL's password."""
    return printable(scrub(text), limit)


def lost_connection(exc: BaseException) -> bool:
    """True when ``exc`` means no connection to the app (not a slow or a wrong answer)."""
    # A timeout is a slow app; a TLS failure or an answer that is not HTTP is an app that
    # answered.  All of them keep the ordinary retry semantics.
    return isinstance(exc, (CannotConnect, Disconnected, ConnectionError))


def body_for(row: FireRow, term: int, holder: str) -> dict[str, Any]:
    return {
        "id": row.id,
        "uid": row.uid,
        "namespace": row.namespace,
        "name": row.name,
        "target": row.target,
        "scheduledAt": rfc3339(row.due_at),
        "attempt": row.attempt,
        "term": term,
        "holder": holder,
        "payload": row.payload,
    }


class BodyError(ValueError):
    """The row's request cannot be built (its payload is not JSON-serialisable, or a header
    from it cannot be carried by HTTP): the row fails at once, not the term and not after its
    retries (``schedlock.sidecar.firing``)."""


def encode_body(row: FireRow, term: int, holder: str) -> bytes:
    """The request body; the payload was bounded when decoded (schedlock.core.payloads), so
    json.dumps recurses at most that deep."""
    try:
        return json.dumps(body_for(row, term, holder), separators=(",", ":")).encode()
    except (TypeError, ValueError, RecursionError, UnicodeEncodeError) as exc:
        raise BodyError(f"the request body cannot be built: {exc}") from exc


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header value; apps verify it the same way (see docs/architecture.md)."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@dataclass(eq=False)
class Deliverer:
    """One HTTP client per sidecar process, its connections bounded by the concurrency."""

    target_url: str
    _: KW_ONLY
    timeout_seconds: float
    concurrency: int
    signing_secret: bytes | None = None
    holder: str = ""
    _client: HttpClient | None = field(default=None, init=False)

    async def __aenter__(self) -> Deliverer:
        self._client = HttpClient(
            self.target_url, f"schedlock/{__version__}", limit=self.concurrency
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def deliver(self, row: FireRow, term: int) -> Delivery:
        if self._client is None:
            raise RuntimeError("Deliverer used outside its context")
        body = encode_body(row, term, self.holder)
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key(row.uid, row.due_at),
            "X-Schedlock-Term": str(term),
            "X-Schedlock-Attempt": str(row.attempt),
        }
        if self.signing_secret:
            headers[SIGNATURE_HEADER] = sign(self.signing_secret, int(utcnow().timestamp()), body)
        try:
            async with asyncio.timeout(self.timeout_seconds):
                answer = await self._client.request(
                    "POST",
                    self.target_url,
                    body=body,
                    headers=headers,
                    read_limit=MAX_ERROR_BODY,
                    reuse_limit=MAX_REUSED_BODY,
                )
        except TimeoutError:
            return Delivery(
                AttemptResult(status=None, error=f"timeout after {self.timeout_seconds:g}s")
            )
        except CannotSend as exc:
            raise BodyError(str(exc)) from exc  # no retry can send it
        except CannotConnect as exc:
            error = f"cannot connect to app: {exc}"
            return Delivery(AttemptResult(status=None, error=error), lost_connection(exc))
        except (HttpFailure, OSError) as exc:
            error = error_text(f"{type(exc).__name__}: {exc}", 300)
            return Delivery(AttemptResult(status=None, error=error), lost_connection(exc))
        if 200 <= answer.status < 300:
            return Delivery(AttemptResult(status=answer.status, error=None))
        text = answer.body.decode("utf-8", "replace").strip().splitlines()
        # the body's first line only: "HTTP <status> from app" is the decision's to say
        detail = error_text(text[0], 200) if text else None
        return Delivery(AttemptResult(status=answer.status, error=detail))
