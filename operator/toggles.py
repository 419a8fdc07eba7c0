"""kopf's readiness toggles, waking their waiters only when the set's state changes.

kopf holds every object's handlers until every object of its initial listing is in the indices
(``kopf.index``, which the operator uses for its :class:`~schedlock.operator.handlers.ObjectIndex`):
the watcher makes one toggle per listed object in one :class:`ToggleSet` and each object's
worker waits on the set's condition until the set is on.  kopf's set notifies *every* waiter
whenever a toggle is made or dropped, so n listed objects cost n² wake-ups (each re-taking the
condition's lock and re-checking) before the first handler runs: a restart with 10,000 objects
spent more than ten minutes of CPU on it and made no request at all meanwhile
(docs/performance.md, ``operator_10k``).  The waiters wait for the set's state only (all on, or
any on), so waking them when that state flips is enough, and it is what this set does.

:func:`install` puts it in kopf's place for the sets kopf makes from then on (kopf makes them
when the operator starts, from the module's name, so it must run before ``kopf.operator``).
"""

from __future__ import annotations

from collections.abc import Iterable

from kopf._cogs.aiokits import aiotoggles


class StateToggleSet(aiotoggles.ToggleSet):
    """kopf's ToggleSet whose make/drop notify only when ``is_on()`` changes."""

    async def make_toggle(
        self, __val: bool = False, *, name: str | None = None
    ) -> aiotoggles.Toggle:
        toggle = aiotoggles.Toggle(__val, name=name, condition=self._condition)
        async with self._condition:
            was = self.is_on()
            self._toggles.add(toggle)
            if self.is_on() != was:
                self._condition.notify_all()
        return toggle

    async def drop_toggle(self, toggle: aiotoggles.Toggle) -> None:
        await self.drop_toggles((toggle,))

    async def drop_toggles(self, toggles: Iterable[aiotoggles.Toggle]) -> None:
        async with self._condition:
            was = self.is_on()
            self._toggles.difference_update(toggles)
            if self.is_on() != was:
                self._condition.notify_all()


def install() -> None:
    """kopf makes its toggle sets as this class from now on (idempotent)."""
    aiotoggles.ToggleSet = StateToggleSet  # type: ignore[misc]
