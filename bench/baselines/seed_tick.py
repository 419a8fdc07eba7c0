"""Baseline ``seed_tick``: the design this project started from.

Every replica runs a 10 s tick.  Each tick takes a connection from a ``psycopg_pool`` pool,
calls ``pg_try_advisory_lock(key)``; the replica that gets it fires up to 25 due rows one by
one (POST, then mark the row) and calls ``pg_advisory_unlock(key)``; the others do nothing
until their next tick.  Replicas start at random phases of the tick, as pods started at
different times do.

``python -m bench.baselines.seed_tick --name N --database-url U --target-url T --status-file F``
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import random
import time

from psycopg_pool import ConnectionPool

from bench.baselines.common import Firer, sleep_until, start

log = logging.getLogger("seed_tick")


def lock_key(namespace: str, target: str) -> int:
    """The seed's single bigint advisory lock key for (namespace, target)."""
    digest = hashlib.sha256(f"seed/{namespace}/{target}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tick-seconds", type=float, default=10.0)
    parser.add_argument("--batch", type=int, default=25)


def main() -> None:
    args, status = start(__doc__, _arguments, logging.INFO)
    key = lock_key(args.namespace, args.target)
    firer = Firer(args.name, args.target_url)
    pool = ConnectionPool(
        args.database_url,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True, "application_name": args.name},
        open=True,
    )
    pool.wait()
    status.update(ready=True, tick_seconds=args.tick_seconds, key=key)
    next_tick = time.monotonic() + random.uniform(0, args.tick_seconds)
    while True:
        sleep_until(next_tick)
        next_tick += args.tick_seconds
        with pool.connection() as conn:
            (locked,) = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() or (
                False,
            )
            if not locked:
                continue
            try:
                for row in firer.due(conn, args.namespace, args.target, args.batch):
                    firer.fire(conn, row)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        status.update(fires=firer.fires)


if __name__ == "__main__":
    main()
