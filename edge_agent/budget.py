"""Per link class: the daily byte budget (UTC day, persisted in the log) and the rate
limit. Every request body sent is charged before it goes out, including batches whose
reply never came: on a metered link the bytes left the ship either way.

The day is read from the agent's :class:`~edge_agent.clock.SteadyClock` (the wall clock
with its jumps taken out): a clock set days ahead does not open a fresh day, and one
set back does not reopen a day already spent; a new day needs the time to pass. And
the budget's day never goes backwards."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from edge_agent.clock import SHIP_CLOCK
from edge_agent.config import LinkConfig
from edge_agent.linkstate import Links

__all__ = ["LinkBudget", "utc_day"]


def utc_day(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d")


class LinkBudget:
    """One per link class, shared by every gateway reached over that class."""

    def __init__(
        self, link: LinkConfig, links: Links, *, clock: Callable[[], float] = SHIP_CLOCK.now
    ) -> None:
        self.link = link
        self._links = links
        self._clock = clock
        self._day = utc_day(clock())
        self._spent = links.spend(link.name, self._day)
        self._next_free = 0.0  # monotonic time the rate limit lets the next body go
        self._spent_out_day = ""

    @property
    def limit(self) -> int:
        """Bytes per UTC day; 0: unlimited."""
        return self.link.daily_budget_bytes

    def _roll(self) -> None:
        day = utc_day(self._clock())
        if day > self._day:  # YYYY-MM-DD: never back to a day already counted
            self._day = day
            self._spent = self._links.spend(self.link.name, day)

    @property
    def day(self) -> str:
        self._roll()
        return self._day

    @property
    def spent(self) -> int:
        """Bytes sent today over this link class."""
        self._roll()
        return self._spent

    def remaining(self) -> int | None:
        """Bytes left today; None when unlimited."""
        if not self.limit:
            return None
        return max(0, self.limit - self.spent)

    def fits(self, nbytes: int) -> bool:
        left = self.remaining()
        return left is None or nbytes <= left

    @property
    def spent_out(self) -> bool:
        """Today's budget cannot take even one more record: nothing more goes today."""
        return self._spent_out_day == self.day

    def mark_spent_out(self) -> None:
        self._spent_out_day = self.day

    def seconds_to_next_day(self) -> float:
        now = datetime.fromtimestamp(self._clock(), UTC)
        midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
        return max(0.0, (midnight - now).total_seconds())

    async def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` as sent today, durably (before they are sent: a crash after
        sending must not hand the satellite link its bytes back)."""
        day = self.day
        self._spent = await asyncio.to_thread(self._links.add_spend, self.link.name, day, nbytes)

    async def pace(self, nbytes: int) -> None:
        """Wait until the rate limit lets ``nbytes`` go, then book them."""
        rate = self.link.max_rate
        if not rate:
            return
        now = time.monotonic()
        wait = self._next_free - now
        if wait > 0:
            await asyncio.sleep(wait)
            now = time.monotonic()
        self._next_free = max(now, self._next_free) + nbytes / rate
