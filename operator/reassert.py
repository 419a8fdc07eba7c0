"""Level-triggered re-assertion: every object's row, compared and restored on an interval.

The handlers write rows on edges; a restore, an asynchronous fail-over or a manual delete can
lose a row or send it back in time behind them.  Every ``reassert_seconds`` this loop compares
what the operator's index of the objects declares with one ``(uid, generation, state)`` query and
writes only what differs.  docs/architecture.md ("The status is the record of an outcome")
has the rule it shares with retention and the upsert handler (:func:`upsert_rule`).

Invariants:

* The object is the source of truth, but only once the handlers are done with it
  (``status.observedGeneration`` equals ``metadata.generation``): a newer generation, an object
  the handlers never reached, an invalid spec or one being deleted is theirs.
* The status is the record of an outcome: a missing row under a status that records a
  terminal outcome for the current generation is done (pruned or lost) and nothing is
  written; a row that went *back* (``scheduled``/``suspended``) under it is stored in that
  outcome, so it never fires again.
* A row that moved on (firing, finished at its generation, a newer generation) is never
  overwritten; a missing or older row is written by the handlers' own idempotent upsert.
* The decision is :func:`plan`, pure; :class:`Reasserter` only reads, writes what the plan
  says and re-checks that an object still exists around each write.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from schedlock.core.aio import sleep_unless
from schedlock.core.identities import Scheduler
from schedlock.core.logs import Event
from schedlock.operator import mapping
from schedlock.store import (
    RECORDED_OUTCOMES,
    PublishSpec,
    ReadOnlyServer,
    RecordedOutcome,
    RowState,
    RowVersion,
    ScheduleSpec,
    Store,
    StoreError,
)

log = logging.getLogger("schedlock.operator.reassert")

# status.phase -> the row state it records (only outcomes that must never fire again)
TERMINAL_PHASES = {state.title(): state for state in RECORDED_OUTCOMES}
REARMABLE = frozenset({RowState.SCHEDULED, RowState.SUSPENDED})  # what a recorded outcome overrides


def snapshot(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the index keeps of an object: a plain copy of what :func:`plan` reads."""
    meta = body.get("metadata") or {}
    return {
        "metadata": {
            key: meta.get(key)
            for key in ("namespace", "name", "uid", "generation", "deletionTimestamp")
        },
        "spec": _plain(body.get("spec") or {}),
        "status": _plain(body.get("status") or {}),
    }


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def recorded_outcome(status: Mapping[str, Any]) -> RecordedOutcome | None:
    """The terminal outcome an object's status records (None: none, it may still fire)."""
    state = TERMINAL_PHASES.get(str(status.get("phase")))
    if state is None:
        return None
    fired = status.get("lastFiredAt")
    by = status.get("firedBy") or {}
    term = by.get("term")
    return RecordedOutcome(
        state=state,
        attempts=int(status.get("attempts") or 0),
        fired_at=mapping.parse_rfc3339(str(fired)) if fired else None,
        last_error=status.get("lastError"),
        term=int(term) if term is not None else None,
        holder=by.get("holder"),
    )


@dataclass
class Plan:
    """What one pass writes; everything else already matches."""

    upserts: list[PublishSpec | ScheduleSpec] = field(default_factory=list)
    restores: list[tuple[PublishSpec, RecordedOutcome]] = field(default_factory=list)
    compared: int = 0  # objects the handlers are done with (the ones a pass owns), compared

    @property
    def writes(self) -> int:
        return len(self.upserts) + len(self.restores)


def went_back(row_generation: int, row_state: str, generation: int) -> bool:
    """Whether a row of ``generation`` (or older) is back where it would fire again."""
    return row_generation <= generation and row_state in REARMABLE


def lost_outcome(obj: Mapping[str, Any], row_generation: int, row_state: str) -> bool:
    """Whether ``obj``'s status records an outcome its row has lost (the row went back).

    Such a row is restored by the re-assertion, never reflected: its ``scheduled`` is a
    restore from an older backup or a lost transaction, not news.
    """
    if not handled(obj) or recorded_outcome(obj.get("status") or {}) is None:
        return False
    generation = int((obj.get("metadata") or {}).get("generation") or 1)
    return went_back(row_generation, row_state, generation)


def handled(obj: Mapping[str, Any]) -> bool:
    """Whether the handlers are done with the object's current generation (a pass owns it)."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return False
    observed = status.get("observedGeneration")
    return observed is not None and int(observed) == int(meta.get("generation") or 1)


def plan(objects: Iterable[Mapping[str, Any]], versions: Iterable[RowVersion]) -> Plan:
    """Compare objects with their rows' (uid, generation, state): what must be written.

    Only an object that needs a write is mapped to its row (``mapping.desired``, which checks
    the whole payload): comparing reads the uid, the generation, the kind and the status, so
    a pass over objects whose rows agree costs a dictionary look-up each (10,000 objects:
    milliseconds, where mapping every one took seconds).
    """
    rows = {(v.kind, v.uid): v for v in versions}
    result = Plan()
    for obj in objects:
        if not handled(obj):
            continue
        meta = obj["metadata"]
        generation = int(meta.get("generation") or 1)
        if (obj.get("spec") or {}).get("schedule"):
            row = rows.get(("schedule", str(meta["uid"])))
            outcome = None
            write = row is None or row.generation < generation
        else:
            row = rows.get((Scheduler.PUBLISH, str(meta["uid"])))
            outcome = recorded_outcome(obj.get("status") or {})
            if outcome is not None:
                # The status records the outcome: a missing row is done (pruned or lost), only
                # a row that went back would fire again.
                write = row is not None and went_back(row.generation, row.state, generation)
            else:
                write = row is None or row.generation < generation
        if write:
            try:
                spec = mapping.desired(obj)
            except (mapping.InvalidSpec, KeyError, TypeError, ValueError):
                continue  # the handlers reported it; nothing to assert
            if outcome is not None:
                assert isinstance(spec, PublishSpec)
                result.restores.append((spec, outcome))
            else:
                result.upserts.append(spec)
        result.compared += 1
    return result


UpsertRule = Literal["write", "skip", "keep"]


def upsert_rule(
    status: Mapping[str, Any], spec: PublishSpec, old_spec: Mapping[str, Any] | None
) -> UpsertRule:
    """What the upsert handler does with a one-shot object, given the outcome its status may
    record (the module's rule):

    * ``skip``: the status records an outcome for this generation — nothing to write, whether
      the row is still there (a replay) or was pruned (a resume after retention);
    * ``keep``: it records one for an older generation and the due time is the same as in the
      last handled spec (``old_spec``, kopf's diff base): the new generation keeps the outcome
      (``restore_publish``: a pruned row is stored in it, a finished one takes the new spec);
    * ``write``: the usual upsert (no outcome; the due time changed, which re-arms; or the
      last handled spec is unknown).
    """
    if recorded_outcome(status) is None:
        return "write"
    observed = status.get("observedGeneration")
    if observed is not None and int(observed) == spec.generation:
        return "skip"
    published_at = (old_spec or {}).get("publishAt")
    if not published_at:
        return "write"
    try:
        same_time = mapping.parse_rfc3339(str(published_at)) == spec.due_at
    except mapping.InvalidSpec:
        return "write"
    return "keep" if same_time else "write"


@dataclass(frozen=True)
class PassResult:
    objects: int
    compared: int
    upserted: int
    restored: int
    seconds: float

    def fields(self, todo: Plan) -> dict[str, object]:
        """The fields of the ``rows_reasserted`` line (docs/operations.md): the counts and the
        first ten uids of each kind of write."""
        return {
            "objects": self.objects,
            "upserted": self.upserted,
            "restored_terminal": self.restored,
            "uids": [s.uid for s in todo.upserts[:10]] + [s.uid for s, _ in todo.restores[:10]],
        }


class Reasserter:
    """Runs :func:`plan` against the store every ``interval`` seconds until stopped."""

    def __init__(
        self,
        store: Store,
        objects: Callable[[], Sequence[Mapping[str, Any]]],
        *,
        interval: float,
        wanted: Callable[[str], bool],
        report: Callable[[StoreError | None], None] | None = None,
    ) -> None:
        self.store = store
        self.objects = objects
        self.interval = interval
        self.wanted = wanted  # does the object still exist, not being deleted (live index)
        self.report = report or (lambda _error: None)
        self.last: PassResult | None = None
        self._wake = asyncio.Event()

    def wake(self) -> None:
        """Run the next pass now (the status sync saw a row that lost its outcome)."""
        self._wake.set()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                self.last = await self.once()
                self.report(None)
            except ReadOnlyServer as exc:
                self.report(exc)
                log.warning(
                    "cannot re-assert rows: read-only server",
                    extra={"event": Event.REASSERT_READ_ONLY, "error": str(exc)},
                )
            except StoreError as exc:
                log.warning(
                    "re-assertion pass failed, retrying",
                    extra={"event": Event.REASSERT_FAILED, "error": str(exc)},
                )
            await sleep_unless(self.interval, stopping, self._wake)
            self._wake.clear()

    async def _cancel_if_deleted(self, spec: PublishSpec | ScheduleSpec) -> None:
        """An object deleted while its row was written: its cancel may have run before the
        row existed, so the row goes now."""
        if self.wanted(spec.uid):
            return
        if isinstance(spec, PublishSpec):
            await self.store.cancel_publish(spec.uid)
        else:
            await self.store.cancel_schedule(spec.uid)

    async def once(self) -> PassResult:
        started = time.perf_counter()
        objects = self.objects()
        uids = [str(o["metadata"]["uid"]) for o in objects if handled(o)]
        versions = await self.store.row_versions(uids) if uids else []
        todo = plan(objects, versions)

        async def restore(spec: PublishSpec, outcome: RecordedOutcome) -> int:
            if not self.wanted(spec.uid):
                return 0
            result = await self.store.restore_publish(spec, outcome)
            await self._cancel_if_deleted(spec)
            return 0 if result.id is None else 1

        # Missing or older rows in batches (Store.upsert_many: not a round trip per row, which
        # a pass that finds every row lost would otherwise pay); the few terminal restores one
        # by one.
        upserts = [spec for spec in todo.upserts if self.wanted(spec.uid)]
        try:
            written = await self.store.upsert_many(upserts) if upserts else []
        finally:  # also when a row failed: the others were written
            for spec in upserts:
                await self._cancel_if_deleted(spec)
        upserted = sum(result.id is not None for result in written)
        restored = sum(await asyncio.gather(*(restore(s, o) for s, o in todo.restores)))
        result = PassResult(
            objects=len(objects),
            compared=todo.compared,
            upserted=upserted,
            restored=restored,
            seconds=time.perf_counter() - started,
        )
        if todo.writes:
            log.warning(
                "re-asserted rows that were missing or stale",
                extra={"event": Event.ROWS_REASSERTED, **result.fields(todo)},
            )
        return result
