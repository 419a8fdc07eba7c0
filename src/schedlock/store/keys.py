"""Advisory lock ids for a lock key — the derivation is part of the database contract.

A lock key is (scheduler, namespace, target).  PostgreSQL advisory locks come in two key spaces:
one bigint (``objsubid = 1`` in ``pg_locks``) and two int4 (``objsubid = 2``).  schedlock only
uses the two-int4 form, so bigint locks taken by other applications can never collide with ours:

* ``classid`` = ``SCHEDLOCK_CLASS_ID`` = 0x53434C4B (ASCII "SCLK"), fixed for every schedlock lock;
* ``objid``   = the first four bytes of SHA-256 over the UTF-8 text
  ``"schedlock/v1/<scheduler>/<namespace>/<target>"``, read big-endian as a signed int4.

Two locks of the same class have fixed objids: ``MIGRATIONS_OBJID`` (0) serialises migrations,
``SYNC_LOCK_OBJID`` (1) elects the operator replica that syncs status.

Another application that also uses the two-int4 form with class 0x53434C4B would collide; pick
a different class there.  Two schedlock keys whose hashes collide (probability ~n²/2³³) would
share one leader and starve each other, so the store registers every key's ids under a UNIQUE
constraint and refuses to start with a clear error instead (:class:`LockKeyCollision`).

Standby places (``schedlock.sidecar.lock``): a key has ``standbys`` places, place ``i`` being the
two-int4 advisory lock

* ``classid`` = ``STANDBY_CLASS_ID`` = 0x53434C53 (ASCII "SCLS"), a class apart from the keys';
* ``objid``   = the same hash over ``"schedlock/v1/<scheduler>/<namespace>/<target>/standby/<i>"``.

A replica waits for the key's lock only while it holds one place on the same session, so at
most ``1 + standbys`` sessions exist per key.  Places live in their own class, so they can
never collide with a key's lock; two keys whose places collide merely share that place (one
standby fewer for each, still bounded and still correct), which needs no registry.

Leadership of a target (:class:`TargetLock`).  A sidecar runs every key of its target (the
publish and the recurring scheduler) on one session.  A session can wait for one lock at a
time, so its replicas queue for one lock per target first, and take the keys' locks after it:

* ``classid`` = ``LEADER_CLASS_ID`` = 0x53434C54 (ASCII "SCLT"), a class of its own;
* ``objid``   = the objid of the target's first key (the publish key, when the sidecar runs
  it).  The keys' objids are registered as unique, so two targets never share a leadership
  lock and no second registry is needed;
* standby places: class ``STANDBY_CLASS_ID``, objids over
  ``"schedlock/v1/<namespace>/<target>/standby/<i>"`` (no scheduler: a text no key's place has).

The keys' own locks stay what fences the rows: a term begins only on a session that holds its
key's lock, so a release that waits per key (before the leadership lock) running beside one
that waits per target (a rolling update) is still fenced per key.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import ClassVar

SCHEDLOCK_CLASS_ID = 0x53434C4B
STANDBY_CLASS_ID = 0x53434C53
LEADER_CLASS_ID = 0x53434C54
MIGRATIONS_OBJID = 0  # the lock that serialises migrations: (SCHEDLOCK_CLASS_ID, 0)
SYNC_LOCK_OBJID = 1  # the operator replica that syncs status holds (SCHEDLOCK_CLASS_ID, 1)


def objid_for(text: str) -> int:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


class AdvisoryLock:
    """What a key's lock and a target's leadership lock share: a ``text`` that names the lock
    and its standby places, and its two-int4 ids (class ``classid``; ``objid`` the hash of the
    text unless the kind says otherwise)."""

    classid: ClassVar[int]

    @property
    def text(self) -> str:
        raise NotImplementedError

    @property
    def objid(self) -> int:
        return objid_for(self.text)

    def standby_objids(self, places: int) -> list[int]:
        """The objids of the lock's standby places 0 .. places-1 (class ``STANDBY_CLASS_ID``)."""
        return [objid_for(f"{self.text}/standby/{i}") for i in range(places)]

    def params(self) -> dict[str, object]:
        """The lock ids as query parameters (``classid``, ``objid``)."""
        return {"classid": self.classid, "objid": self.objid}


@dataclass(frozen=True, order=True)
class LockKey(AdvisoryLock):
    scheduler: str
    namespace: str
    target: str

    classid: ClassVar[int] = SCHEDLOCK_CLASS_ID

    @property
    def text(self) -> str:
        return f"schedlock/v1/{self.scheduler}/{self.namespace}/{self.target}"

    def params(self) -> dict[str, object]:
        """The key as query parameters: its three parts and its lock ids."""
        return {**dataclasses.asdict(self), **super().params()}

    def __str__(self) -> str:
        return f"{self.scheduler}/{self.namespace}/{self.target}"


@dataclass(frozen=True)
class TargetLock(AdvisoryLock):
    """The leadership lock of a target's keys (``keys[0]`` names it): what its replicas queue
    for, one session each, before taking the keys' own locks."""

    keys: tuple[LockKey, ...]

    classid: ClassVar[int] = LEADER_CLASS_ID

    def __post_init__(self) -> None:
        parts = {(k.namespace, k.target) for k in self.keys}
        if len(parts) != 1:
            raise ValueError(f"a target lock is over the keys of one target, got {self.keys}")

    @property
    def namespace(self) -> str:
        return self.keys[0].namespace

    @property
    def target(self) -> str:
        return self.keys[0].target

    @property
    def text(self) -> str:
        return f"schedlock/v1/{self.namespace}/{self.target}"

    @property
    def objid(self) -> int:
        return self.keys[0].objid

    def __str__(self) -> str:
        return f"{self.namespace}/{self.target}"
