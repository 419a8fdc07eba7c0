"""A procrastinate worker, as its users run one: ``python -m bench.peers.procrastinate_worker``.

    … migrate --database-url URL        procrastinate's own schema (``procrastinate schema --apply``)
    … work --name N --database-url URL --target-url URL --status-file PATH

The task ``fire`` POSTs its job's row (the same JSON body as every other system) to the
recording app; a non-2xx answer raises, so procrastinate marks the job failed.  Every worker
setting is procrastinate's default (concurrency 1, LISTEN/NOTIFY with a 5 s fetch polling
interval, 10 s heartbeat, 30 s stalled-worker timeout, graceful shutdown on SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import procrastinate
from procrastinate.worker import Worker

from bench.baselines.common import Status


def application(url: str, name: str) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(conninfo=url, kwargs={"application_name": name})
    return procrastinate.App(connector=connector)


async def migrate(url: str) -> None:
    app = application(url, "procrastinate-migrate")
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def work(name: str, url: str, target_url: str, status: Status) -> None:
    app = application(url, name)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        @app.task(name="fire", pass_context=True)
        async def fire(context: procrastinate.JobContext, /, **row: Any) -> None:
            job = context.job
            body = {**row, "attempt": job.attempts + 1, "term": None, "holder": name}
            async with http.post(
                target_url,
                data=json.dumps(body, separators=(",", ":")),
                headers={
                    "Content-Type": "application/json",
                    "Idempotency-Key": f"{row['uid']}/{row['scheduledAt']}",
                },
            ) as response:
                if not 200 <= response.status < 300:
                    raise RuntimeError(f"target answered {response.status}")

        async with app.open_async():
            # What App.run_worker_async does, keeping the worker to publish the id it registers
            # under (the harness tells which jobs a killed worker leaves in 'doing' by it).
            worker = Worker(app=app, name=name)
            running = asyncio.create_task(worker.run())  # type: ignore[no-untyped-call]
            while worker.worker_id is None and not running.done():
                await asyncio.sleep(0.02)
            status.update(ready=worker.worker_id is not None, worker_id=worker.worker_id)
            await running


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.procrastinate_worker")
    parser.add_argument("command", choices=("migrate", "work"))
    parser.add_argument("--name", default="procrastinate")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--target-url")
    parser.add_argument("--status-file", type=Path)
    args = parser.parse_args(argv)
    if args.command == "migrate":
        asyncio.run(migrate(args.database_url))
        return 0
    if args.target_url is None or args.status_file is None:
        parser.error("work needs --target-url and --status-file")
    status = Status(args.status_file, args.name)
    asyncio.run(work(args.name, args.database_url, args.target_url, status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
