"""kopf handlers for ScheduledPublish: upsert rows, cancel on delete, validate on admission.

The operator never fires anything: it only writes rows (keyed by the object's uid and
generation, so replays are no-ops) and reflects outcomes back (``schedlock.operator.sync``).
Errors are mapped on purpose: a database that is down is a ``TemporaryError`` (retried with a
delay, bounded), a spec that cannot work is marked ``InvalidSpec`` with one Warning Event
(:func:`invalid`) and not retried.

API cost: an object's create costs two PATCHes — one of the object (the finalizer and kopf's
last-handled annotation, one merge patch) and one of its status.  kopf would add its finalizer
in a PATCH of its own before the first handler runs, for any object a mandatory deletion
handler matches; ours matches only objects that already hold the finalizer, so kopf neither
adds nor removes it, and the upsert puts it in its own patch once the row exists.  From then
on it is kopf's as before: an object deleted while the operator is down waits for the cancel
handler, and kopf removes the finalizer once the cancel succeeded.  Events are posted for
outcomes only (here: an invalid spec, a cancel on delete; the sync posts the fire outcomes).

Retention: an object whose status records an outcome for its current generation is done — its
row may have been pruned — so the upsert writes nothing for it (``reassert.upsert_rule``, the
rule written down in ``schedlock.operator.reassert``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import platform
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

import kopf

from schedlock.core.aio import utcnow
from schedlock.core.logs import Event
from schedlock.operator import mapping
from schedlock.operator.crd import GROUP, PLURAL, VERSION
from schedlock.operator.injection import InjectionConfig, inject_pod, refusal
from schedlock.operator.reassert import recorded_outcome, snapshot, upsert_rule
from schedlock.store import (
    RECORDED_OUTCOMES,
    PublishSpec,
    RowState,
    Store,
    StoreError,
    StoreUnavailable,
)

log = logging.getLogger("schedlock.operator.inject")
RETRIES = 20
LIST_PAGE = 500  # objects per page of a listing (kopf's: settings.watching.chunk_size; ours)
# The deepest JSON the API server takes (Go's encoding/json refuses more than 10,000 levels),
# so the deepest object kopf may have to read: a ScheduledPublish whose payload nests that
# deep can be stored while the webhook is down (failurePolicy: Ignore).
API_MAX_DEPTH = 10_000
# Python frames kopf spends per level of such an object: json.loads (its C decoder counts
# against the recursion limit in Python 3.11), copy.deepcopy (two per level), kopf's diffs.
FRAMES_PER_LEVEL = 3
FINALIZER = "schedlock.dev/finalizer"
ANNOTATIONS_PREFIX = "schedlock.dev"


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf's own state lives under our prefix; kopf's log records post as Events at WARNING.

    The recursion limit is raised so that kopf reads any object the API server holds: at the
    default (1,000) one ScheduledPublish with a payload nested ~1,000 deep made kopf's
    json.loads raise RecursionError — in the webhook (500, so failurePolicy: Ignore admitted
    it) and then in every list and watch of the resource, for every namespace.  Read, such an
    object is refused by the one payload check (``spec.payload nests deeper than 32 levels``:
    the webhook's 422, or the handlers' InvalidSpec), which walks it without recursion.
    """
    sys.setrecursionlimit(max(sys.getrecursionlimit(), FRAMES_PER_LEVEL * API_MAX_DEPTH + 1_000))
    problem = deep_objects_problem()
    if problem is not None:
        log.warning(
            "cannot read the deepest objects the API server stores",
            extra={"event": Event.DEEP_OBJECTS_UNREADABLE, "error": problem},
        )
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATIONS_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATIONS_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING  # our own Events go through kopf.event()
    settings.scanning.disabled = True  # no RBAC on CRDs/namespaces needed
    settings.execution.max_workers = 8
    settings.batching.error_delays = [1, 2, 5, 10, 20, 30]
    settings.watching.server_timeout = 300
    # The initial listing in pages (kopf's chunked LIST): one LIST of every object is one
    # response held and parsed whole, a peak of memory that stays with the process.
    settings.watching.chunk_size = LIST_PAGE
    settings.networking.request_timeout = 30


def deep_objects_problem(depth: int = API_MAX_DEPTH) -> str | None:
    """Why this interpreter cannot take an object nested ``depth`` deep through what kopf does
    with each (json.loads, copy.deepcopy), or None.  The raised recursion limit is what lets
    it on Python 3.11, whose JSON decoder counts against that limit; an interpreter that
    bounds such recursion otherwise (a C stack limit) is told apart here, at start."""
    text = "[" * depth + "]" * depth
    try:
        copy.deepcopy(json.loads(text))
    except RecursionError:
        return (
            f"Python {platform.python_version()} cannot read JSON nested {depth} deep (the "
            "API server stores objects that deep): one ScheduledPublish nested so would stop "
            "this operator's watches; run the image's Python 3.11"
        )
    return None


class ObjectIndex:
    """Every ScheduledPublish the operator knows of, in memory: what the status sync and the
    re-assertion read instead of asking the API server per object.

    Two feeds.  kopf's watch events, through an event handler (:meth:`saw`): each replaces the
    object's snapshot, and a deletion drops it.  And one paged listing of the operator's own
    at start (:func:`list_into`, :meth:`listed`), which tells when the index holds every object
    there is; kopf gives no such signal unless the operator uses ``kopf.index``, whose
    guarantee costs every listed object a worker that waits, holding its event, for the whole
    listing to be indexed (about 18 KB each: 180 MB at 10,000 objects, docs/performance.md,
    ``operator_10k``).  The watch wins: the listing adds only objects the watch has not shown,
    and never one the watch saw deleted, so a listing older than an event cannot undo it.
    """

    def __init__(self) -> None:
        self._objects: dict[str, dict[str, Any]] = {}
        # uids the watch saw deleted before the listing was in (afterwards none is kept)
        self._deleted: set[str] = set()
        # set once the listing is in: from then on an object the index lacks does not exist
        # (or the watch has not shown it yet, as for any object created after the listing)
        self.complete = asyncio.Event()

    def saw(self, body: Mapping[str, Any], deleted: bool) -> None:
        """A watch event's object (kopf's listing or its watch): its snapshot from now on."""
        uid = str(body["metadata"]["uid"])
        if deleted:
            self._objects.pop(uid, None)
            if not self.complete.is_set():
                self._deleted.add(uid)
        else:
            self._objects[uid] = snapshot(body)

    def listed(self, page: Iterable[Mapping[str, Any]]) -> None:
        """A page of the operator's own listing: the objects the watch has not shown yet."""
        for body in page:
            uid = str(body["metadata"]["uid"])
            if uid not in self._objects and uid not in self._deleted:
                self._objects[uid] = snapshot(body)

    def listing_done(self) -> None:
        self._deleted.clear()
        self.complete.set()

    def objects(self) -> list[dict[str, Any]]:
        return list(self._objects.values())

    def get(self, uid: str) -> dict[str, Any] | None:
        """The object's latest snapshot (a new one after every watch event), None: not seen."""
        return self._objects.get(uid)

    def wanted(self, uid: str) -> bool:
        """The object is still there and not being deleted."""
        obj = self._objects.get(uid)
        return obj is not None and not obj["metadata"].get("deletionTimestamp")


ListPage = Callable[[str | None, str | None], Awaitable[tuple[list[dict[str, Any]], str | None]]]


async def list_into(objects: ObjectIndex, list_page: ListPage, namespaces: Sequence[str]) -> int:
    """Every object of ``namespaces`` (none: the whole cluster) into ``objects``, a page at a
    time (``list_page(namespace, continue_token)`` -> the page's objects and the next token):
    one page is in memory at once.  Then the index is complete.  A failed request fails the
    whole listing (run again from the start, which the index takes as often as it comes).
    Returns how many objects were listed."""
    count = 0
    for namespace in namespaces or (None,):
        token: str | None = None
        while True:
            page, token = await list_page(namespace, token)
            objects.listed(page)
            count += len(page)
            if not token:
                break
    objects.listing_done()
    return count


def held(body: kopf.Body, **_: Any) -> bool:
    """The object holds our finalizer (the cancel handler's filter: see the module's doc)."""
    return FINALIZER in (body.meta.get("finalizers") or [])


def unreconciled(body: kopf.Body, status: kopf.Status, **_: Any) -> bool:
    """The resume handler's filter: whether a restart has anything to do for the object.

    An object that holds our finalizer and whose status observes its current generation was
    reconciled by an earlier run (its row written, or its outcome or invalid spec recorded):
    resuming it would cost a database round trip and a kopf handler run each, for nothing.
    Its row is checked by the re-assertion instead, for every object in one query, right after
    the operator's listing of the objects (``schedlock.operator.process``): a row lost while
    the operator was down comes back as before, without a per-object write for the others.
    """
    observed = status.get("observedGeneration")
    current = int(body.meta.get("generation") or 1)
    return not (held(body) and observed is not None and int(observed) == current)


def hold(body: kopf.Body, patch: kopf.Patch) -> None:
    """The finalizer rides in the handler's patch (a merge patch replaces the whole list)."""
    if not held(body):
        patch.metadata["finalizers"] = [*(body.meta.get("finalizers") or []), FINALIZER]


def invalid(body: kopf.Body, status: kopf.Status, patch: kopf.Patch, problem: str) -> None:
    """A spec that cannot work: status Failed, Ready=False InvalidSpec, one Warning Event.

    Not retried, and not raised (kopf would post a second Warning of its own).  Said once per
    generation: a resume (operator restart) of an object already marked so changes nothing.
    """
    generation = int(body.meta.get("generation") or 1)
    ready = mapping.Ready("False", "InvalidSpec", problem)
    said = mapping.ready_condition(status)
    if (
        status.get("observedGeneration") == generation
        and said is not None
        and (said.get("reason"), said.get("message")) == (ready.reason, ready.message)
    ):
        return
    patch.status["phase"] = "Failed"
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = mapping.conditions(
        status.get("conditions"), ready, generation, utcnow()
    )
    kopf.warn(body, reason="InvalidSpec", message=problem)


def build_registry(
    store: Store,
    *,
    validate: bool,
    injection: InjectionConfig | None = None,
    objects: ObjectIndex | None = None,
) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    if objects is not None:
        watched = objects

        # async: kopf runs a plain function in its thread pool, a hop per watch event.  kopf
        # calls event handlers before the others, so an object is in the index before its
        # create handler writes its row.
        @kopf.on.event(*resource, registry=registry, id="index")
        async def index(body: kopf.Body, type: str | None, **_: Any) -> None:
            watched.saw(body, deleted=type == "DELETED")

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        """In a pod: the mounted ServiceAccount token; elsewhere: $KUBECONFIG / ~/.kube/config."""
        return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)

    async def upsert(
        body: kopf.Body, status: kopf.Status, patch: kopf.Patch, old: Any = None, **_: Any
    ) -> None:
        try:
            spec = mapping.desired(body)
        except mapping.InvalidSpec as exc:
            invalid(body, status, patch, str(exc))
            return
        # The status is the record of an outcome (reassert's rule): a row pruned after it
        # fired must not come back as scheduled on a resume or a payload edit.
        rule = (
            upsert_rule(status, spec, (old or {}).get("spec"))
            if isinstance(spec, PublishSpec)
            else "write"
        )
        if rule == "skip":
            hold(body, patch)
            return  # this generation's outcome is recorded: its row is done, pruned or not
        try:
            if rule == "keep":
                assert isinstance(spec, PublishSpec)
                outcome = recorded_outcome(status)
                assert outcome is not None
                result = await store.restore_publish(spec, outcome)
            elif isinstance(spec, PublishSpec):
                result = await store.upsert_publish(spec)
            else:
                result = await store.upsert_schedule(spec)
        except StoreUnavailable as exc:
            raise kopf.TemporaryError(f"database unavailable: {exc}", delay=5) from exc
        except StoreError as exc:
            raise kopf.TemporaryError(f"database error: {exc}", delay=15) from exc
        hold(body, patch)  # a row exists: deleting the object must wait for its cancel
        if rule == "keep" or (result.id is not None and result.state in RECORDED_OUTCOMES):
            # A new generation of a row that keeps its outcome (same due time): the status
            # still tells the truth, now about this generation (the re-assertion relies on it).
            patch.status["observedGeneration"] = spec.generation
            return
        if result.id is None or result.state not in (
            RowState.SCHEDULED,
            RowState.SUSPENDED,
            "active",
        ):
            return  # a replay, or a row that already fired and keeps its outcome
        new = mapping.scheduled_status(spec, status, utcnow())
        for key, value in new.items():
            patch.status[key] = value  # Scheduled/Suspended show there: no Event for them

    for decorator in (kopf.on.create, kopf.on.update):
        decorator(*resource, registry=registry, id="upsert", retries=RETRIES, backoff=5)(upsert)
    kopf.on.resume(
        *resource, registry=registry, id="upsert", retries=RETRIES, backoff=5, when=unreconciled
    )(upsert)

    async def cancel_rows(uid: str, spec: kopf.Spec) -> bool:
        if spec.get("schedule"):
            return await store.cancel_schedule(uid) >= 0
        return await store.cancel_publish(uid)

    # when=held: kopf requires the finalizer only where the upsert already put it (no PATCH
    # of its own on create), and keeps it there until this handler succeeded
    @kopf.on.delete(
        *resource, registry=registry, id="cancel", retries=RETRIES, backoff=5, when=held
    )
    async def cancel(body: kopf.Body, spec: kopf.Spec, **_: Any) -> None:
        try:
            cancelled = await cancel_rows(str(body.meta["uid"]), spec)
        except StoreError as exc:
            raise kopf.TemporaryError(f"cannot cancel the row: {exc}", delay=5) from exc
        if cancelled and not spec.get("schedule"):
            kopf.event(
                body,
                type="Normal",
                reason="Cancelled",
                message="deleted before it fired: cancelled",
            )
        elif spec.get("schedule"):
            kopf.event(
                body,
                type="Normal",
                reason="Cancelled",
                message="deleted: the schedule will not fire again",
            )

    def deleted(type: str, **_: Any) -> bool:
        return type == "DELETED"  # a filter: kopf logs nothing for the other events

    @kopf.on.event(*resource, registry=registry, id="gone", when=deleted)
    async def gone(body: kopf.Body, spec: kopf.Spec, **_: Any) -> None:
        """An object gone for good: its row is cancelled, even if the object went away before
        the patch adding our finalizer (deleted right after its row's upsert).  After the
        cancel handler this changes nothing; no API call either way (kopf logs a failure)."""
        await cancel_rows(str(body.meta["uid"]), spec)

    if injection is not None:

        @kopf.on.mutate("", "v1", "pods", registry=registry, id="inject", operations=["CREATE"])
        def inject(
            body: kopf.Body,
            patch: kopf.Patch,
            warnings: list[str],
            namespace: str | None = None,
            **_: Any,
        ) -> None:
            metadata, spec = dict(body.get("metadata") or {}), dict(body.get("spec") or {})
            problem = refusal(metadata, injection)
            if problem is not None:
                # The pod does not exist yet (no uid for an Event): the warning goes back to
                # whoever creates it (kubectl prints it; a ReplicaSet's goes to the
                # controller), so the log is where an operator finds it.
                warnings.append(f"schedlock: {problem}")
                log.warning(
                    "pod admitted without the sidecar",
                    extra={
                        "event": Event.POD_NOT_INJECTED,
                        "namespace": namespace or metadata.get("namespace"),
                        "pod": metadata.get("name") or metadata.get("generateName"),
                        "reason": problem,
                    },
                )
                return
            changed = inject_pod(metadata, spec, injection)
            if changed is not None:
                patch.metadata["labels"] = changed[0]["labels"]
                patch.spec["initContainers"] = changed[1]["initContainers"]
                if changed[1].get("volumes") != spec.get("volumes"):
                    patch.spec["volumes"] = changed[1]["volumes"]  # the signing secret

    if validate:

        @kopf.on.validate(
            *resource, registry=registry, id="validate", operations=["CREATE", "UPDATE"]
        )
        def check(spec: kopf.Spec, **_: Any) -> None:
            problems = mapping.spec_problems(dict(spec))
            if problems:
                raise kopf.AdmissionError("; ".join(problems), code=422)

    return registry
