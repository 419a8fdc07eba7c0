"""When a reserve checks for a free standby place, and how long it backs off when refused.

A *reserve* is a replica that holds no database session for a key: the leader and at most
``standbys`` standbys hold the key's sessions (``schedlock.sidecar.lock``).  A reserve connects
now and then, tries to take a free standby place, and when there is none enlists in the key's
roster and disconnects.  Everything here is a pure function of its inputs; the elector carries
out what it decides.

Turns.  The database clock (which every reserve reads at its check, so no local clock has to
agree) is cut into turns of ``interval`` seconds: turn ``k`` starts at ``k * interval`` (Unix
time) and belongs to the reserve whose rank among the key's live reserves, ordered by holder
name, is ``k mod R``.  So the R reserves of a key *together* check about once per interval,
whatever R is — the cost stays flat as the app scales — and each of them once every R
intervals.  A small positive jitter (at most ``JITTER`` of the interval) keeps two reserves
whose view of the roster differs for a moment (one just joined) from arriving in the same
millisecond.

Bounds.  With the roster settled, some reserve checks within ``interval * (1 + JITTER)`` of
any instant: when the leader and every standby die at once, a reserve takes a place and — the
key's lock being free — leads within that bound plus one connection set-up.  A reserve that
died keeps its turns until its row expires (its promised next check plus :func:`grace`), so
each dead reserve can cost one missed turn; a roster that changes (a replica joins or leaves)
can shift turns for one rotation.

Refusals.  A server out of connection slots refuses with "too many clients" (SQLSTATE 53300).
The reserve then waits for the later of its next turn and an exponential back-off with jitter
(``REFUSED_FIRST`` doubling to ``REFUSED_CAP``), so refused replicas add no storm of their own
on top of a database that is already full.
"""

from __future__ import annotations

import math
import random

from schedlock.core.aio import Backoff

JITTER = 0.1
REFUSED_FIRST = 1.0  # seconds: the first back-off after a refusal (before jitter)
REFUSED_CAP = 60.0  # seconds: back-offs never grow beyond this (before jitter)


def next_check_in(
    db_now: float, *, rank: int, reserves: int, interval: float, draw: float
) -> float:
    """Seconds from ``db_now`` to this reserve's next turn, plus jitter.

    ``draw`` is a random number in [0, 1) (passed in, so the maths stays pure).  The turn is
    strictly after ``db_now``: a reserve that just checked at its own turn waits a rotation.
    """
    count = max(1, reserves)
    mine = rank % count
    turn = math.floor(db_now / interval) + 1
    turn += (mine - turn) % count
    return turn * interval - db_now + draw * JITTER * interval


def grace(interval: float) -> float:
    """How long after its promised next check a reserve's roster row still counts as live:
    long enough for a check that is a little late (a slow connection, a busy host)."""
    return max(interval, 5.0)


def refused_backoff(rng: random.Random) -> Backoff:
    """The back-off after refused connections: the kit's one policy, from ``REFUSED_FIRST``
    doubling to ``REFUSED_CAP``, spread by jitter so no two replicas refused at the same moment
    retry at the same moment."""
    return Backoff(REFUSED_FIRST, REFUSED_CAP, rng)
