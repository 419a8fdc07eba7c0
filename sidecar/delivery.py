"""Delivery of one fire to the app: an HTTP POST on localhost, bounded in time and memory.

Request: ``POST <target-url>`` with a JSON body (id, uid, namespace, name, target, scheduledAt,
attempt, term, holder, payload) and the headers

* ``Idempotency-Key`` — stable per row and scheduled time, identical on every retry and
  re-fire, so the app can drop duplicates;
* ``X-Schedlock-Term`` and ``X-Schedlock-Attempt``;
* ``X-Schedlock-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>`` when a
  signing secret is configured.

The response body is read up to 4 KiB (for the error text), a large success body is never read
(the connection is dropped instead of reused), redirects are not followed and the whole call is
bounded by the request timeout, so a hostile or broken app costs bounded time and memory.
Classification into success / retryable / permanent is pure (``schedlock.scheduling.classify``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from typing import Any

import aiohttp
from schedlock import __version__
from schedlock.scheduling import AttemptResult, idempotency_key
from schedlock.store import FireRow

MAX_ERROR_BODY = 4096
MAX_REUSED_BODY = 64 * 1024
SIGNATURE_HEADER = "X-Schedlock-Signature"


def body_for(row: FireRow, term: int, holder: str) -> dict[str, Any]:
    return {
        "id": row.id,
        "uid": row.uid,
        "namespace": row.namespace,
        "name": row.name,
        "target": row.target,
        "scheduledAt": row.due_at.isoformat().replace("+00:00", "Z"),
        "attempt": row.attempt,
        "term": term,
        "holder": holder,
        "payload": row.payload,
    }


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The signature header value; apps verify it the same way (see docs/architecture.md)."""
    mac = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


class Deliverer:
    """One aiohttp session per sidecar process, connection pool bounded by the concurrency."""

    def __init__(
        self,
        target_url: str,
        *,
        timeout_seconds: float,
        concurrency: int,
        signing_secret: bytes | None = None,
        holder: str = "",
    ) -> None:
        self.target_url = target_url
        self.timeout_seconds = timeout_seconds
        self.concurrency = concurrency
        self.signing_secret = signing_secret
        self.holder = holder
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Deliverer:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.concurrency, ttl_dns_cache=300),
            timeout=aiohttp.ClientTimeout(total=self.timeout_seconds),
            headers={"User-Agent": f"schedlock/{__version__}"},
            auto_decompress=False,
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def deliver(self, row: FireRow, term: int) -> AttemptResult:
        if self._session is None:
            raise RuntimeError("Deliverer used outside its context")
        body = json.dumps(body_for(row, term, self.holder), separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": idempotency_key(row.uid, row.due_at),
            "X-Schedlock-Term": str(term),
            "X-Schedlock-Attempt": str(row.attempt),
        }
        if self.signing_secret:
            headers[SIGNATURE_HEADER] = sign(self.signing_secret, int(time.time()), body)
        try:
            async with self._session.post(
                self.target_url, data=body, headers=headers, allow_redirects=False
            ) as response:
                if 200 <= response.status < 300:
                    # Keep the connection for a small body; never read a big one (drop it).
                    length = response.content_length
                    if length is not None and length <= MAX_REUSED_BODY:
                        await response.release()
                    else:
                        response.close()
                    return AttemptResult(status=response.status, error=None)
                snippet = await response.content.read(MAX_ERROR_BODY)
                text = snippet.decode("utf-8", "replace").strip().splitlines()
                detail = f": {text[0][:200]}" if text else ""
                return AttemptResult(
                    status=response.status, error=f"HTTP {response.status} from app{detail}"
                )
        except TimeoutError:
            return AttemptResult(status=None, error=f"timeout after {self.timeout_seconds:g}s")
        except aiohttp.ClientConnectorError as exc:
            return AttemptResult(status=None, error=f"cannot connect to app: {exc.os_error}")
        except (aiohttp.ClientError, asyncio.IncompleteReadError, OSError) as exc:
            return AttemptResult(status=None, error=f"{type(exc).__name__}: {exc}"[:300])
