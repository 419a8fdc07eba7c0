"""One key's lateness and throughput, measured the same way wherever two set-ups are compared.

The history scenario (an empty database against millions of finished rows) and the tenancy
scenario (the owner's role against roles under row-level security) both run a real sidecar
group on one key and ask the same two questions of it:

* **lateness** — ``count`` rows due evenly over ``span_s``, the first ``LEAD_IN_S`` after they
  are written; arrival at the app minus due time, a row not delivered ``drain_s`` after the
  last due time counted with its lateness so far (a lower bound);
* **throughput** — ``rows`` due at the same instant: delivered / (last arrival − due time), or
  delivered by the cap / the cap (``capped``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.rows import due_times, insert_due
from bench.systems import Instance

LEAD_IN_S = 2.0


def insert(
    inst: Instance, prefix: str, count: int, spacing: float, start_at: float | None = None
) -> float:
    """``count`` rows on the instance's key, the first due LEAD_IN_S from now (or at
    ``start_at``, epoch seconds); returns when."""
    start = time.time() + LEAD_IN_S if start_at is None else start_at
    insert_due(
        inst.db_url,
        prefix=prefix,
        count=count,
        start_at=start,
        spacing=spacing,
        namespace=inst.namespace,
        target=inst.target,
    )
    return start


def late_ms(inst: Instance, due: dict[str, float], cutoff: float) -> list[float]:
    """Each row's lateness; a row not delivered by ``cutoff`` counts with its lateness so far."""
    first = inst.log.first_arrivals()
    return [((first[u].arrival if u in first else cutoff) - at) * 1000 for u, at in due.items()]


async def lateness(
    inst: Instance,
    prefix: str,
    *,
    count: int,
    span_s: float,
    drain_s: float,
    start_at: float | None = None,
) -> list[float]:
    start = insert(inst, prefix, count, span_s / count, start_at)
    due = due_times(inst.db_url, prefix)
    end = start + span_s + drain_s
    while time.time() < end and not set(due) <= set(inst.log.first_arrivals()):
        await asyncio.sleep(0.25)
    return late_ms(inst, due, time.time())


async def throughput(
    inst: Instance, prefix: str, *, rows: int, cap_s: float, lead_s: float = LEAD_IN_S
) -> dict[str, Any]:
    due = insert(inst, prefix, rows, 0.0, time.time() + lead_s)
    end = due + cap_s

    def arrivals() -> list[float]:
        return [e.arrival for u, e in inst.log.first_arrivals().items() if u.startswith(prefix)]

    got = arrivals()
    while time.time() < end and len(got) < rows:
        await asyncio.sleep(0.2)
        got = arrivals()
    capped = len(got) < rows
    seconds = cap_s if capped else max(got) - due
    in_cap = [a for a in got if a <= end]
    return {
        "fires_per_s": round(len(in_cap) / seconds, 1) if seconds > 0 else None,
        "fires": len(in_cap),
        "seconds": round(seconds, 2),
        "capped": capped,
    }
