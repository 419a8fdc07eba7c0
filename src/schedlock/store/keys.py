"""Advisory lock ids for a lock key — the derivation is part of the database contract.

A lock key is (scheduler, namespace, target).  PostgreSQL advisory locks come in two key spaces:
one bigint (``objsubid = 1`` in ``pg_locks``) and two int4 (``objsubid = 2``).  schedlock only
uses the two-int4 form, so bigint locks taken by other applications can never collide with ours:

* ``classid`` = ``SCHEDLOCK_CLASS_ID`` = 0x53434C4B (ASCII "SCLK"), fixed for every schedlock lock;
* ``objid``   = the first four bytes of SHA-256 over the UTF-8 text
  ``"schedlock/v1/<scheduler>/<namespace>/<target>"``, read big-endian as a signed int4.

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
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

SCHEDLOCK_CLASS_ID = 0x53434C4B
STANDBY_CLASS_ID = 0x53434C53
MIGRATIONS_OBJID = 0  # the lock that serialises migrations: (SCHEDLOCK_CLASS_ID, 0)


def objid_for(text: str) -> int:
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


@dataclass(frozen=True, order=True)
class LockKey:
    scheduler: str
    namespace: str
    target: str

    @property
    def text(self) -> str:
        return f"schedlock/v1/{self.scheduler}/{self.namespace}/{self.target}"

    @property
    def classid(self) -> int:
        return SCHEDLOCK_CLASS_ID

    @property
    def objid(self) -> int:
        return objid_for(self.text)

    def standby_objids(self, places: int) -> list[int]:
        """The objids of the key's standby places 0 .. places-1 (class ``STANDBY_CLASS_ID``)."""
        return [objid_for(f"{self.text}/standby/{i}") for i in range(places)]

    def params(self) -> dict[str, object]:
        """The key as query parameters: its three parts and its lock ids."""
        return {**dataclasses.asdict(self), "classid": self.classid, "objid": self.objid}

    def __str__(self) -> str:
        return f"{self.scheduler}/{self.namespace}/{self.target}"
