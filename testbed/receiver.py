"""A real HTTP app for tests, the demo and benchmarks: it records every delivery it receives.

Run as ``python -m testbed.receiver --port P --log FILE``.  Each delivery is appended to
FILE as one JSON line (uid, idempotency key, term, attempt, holder, scheduled time, arrival
time, the status it answered) before the response is sent, so the log is an append-only truth
of what reached the app.  ``POST /control`` changes behaviour at run time::

    {"status": 503}             answer every delivery with 503
    {"status": 200, "delay": 2} answer after 2 s
    {"hang": true}              never answer (until the client gives up)
    {"fail_first": 2}           answer 503 to the first 2 attempts of every uid
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from aiohttp import web


class Receiver:
    def __init__(self, log_path: Path) -> None:
        self.log = log_path.open("a", buffering=1)
        self.status = 200
        self.delay = 0.0
        self.hang = False
        self.fail_first = 0
        self.seen: dict[str, int] = {}

    async def hook(self, request: web.Request) -> web.Response:
        arrival = time.time()
        raw = await request.read()
        body: dict[str, Any] = json.loads(raw)
        uid = body.get("uid", "")
        self.seen[uid] = self.seen.get(uid, 0) + 1
        status = self.status
        if self.fail_first and self.seen[uid] <= self.fail_first:
            status = 503
        entry = {
            "uid": uid,
            "key": request.headers.get("Idempotency-Key"),
            "term": body.get("term"),
            "attempt": body.get("attempt"),
            "holder": body.get("holder"),
            "namespace": body.get("namespace"),
            "target": body.get("target"),
            "scheduledAt": body.get("scheduledAt"),
            "name": body.get("name"),
            "payload": body.get("payload"),
            "signature": request.headers.get("X-Schedlock-Signature"),
            "arrival": arrival,
            "status": status,
        }
        self.log.write(json.dumps(entry) + "\n")
        if self.hang:
            await asyncio.sleep(3600)
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(status=status, text="ok" if status < 300 else "not now")

    async def control(self, request: web.Request) -> web.Response:
        data = await request.json()
        self.status = int(data.get("status", self.status))
        self.delay = float(data.get("delay", self.delay))
        self.hang = bool(data.get("hang", self.hang))
        self.fail_first = int(data.get("fail_first", self.fail_first))
        return web.json_response({"status": self.status, "delay": self.delay, "hang": self.hang})

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--path", default="/schedlock")
    args = parser.parse_args()
    receiver = Receiver(args.log)
    app = web.Application()
    app.router.add_post(args.path, receiver.hook)
    app.router.add_post("/control", receiver.control)
    app.router.add_get("/healthz", receiver.health)
    web.run_app(
        app, host="127.0.0.1", port=args.port, access_log=None, print=None, handle_signals=True
    )
    os._exit(0)


if __name__ == "__main__":
    main()
