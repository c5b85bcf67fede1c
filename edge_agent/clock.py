"""The ship's wall clock with its jumps taken out.

A ship's clock jumps: a GPS receiver or an operator sets it days ahead, NTP steps it
back after a port call. Age retention compares receive times with "now", and the link
budgets count bytes per UTC day: a clock set five days ahead would expire every
undelivered ``drop_oldest`` record at once and open a fresh satellite budget, one set
back would reopen a day already spent.

:class:`SteadyClock` compares, at every reading, how far the wall clock moved with how
far ``time.monotonic()`` moved since the previous reading. A difference beyond
:data:`JUMP_TOLERANCE_S` is a jump: it is logged (``event=clock_jump``), counted and
added to :attr:`SteadyClock.skew`, which :meth:`SteadyClock.now` subtracts. So ``now()``
advances with monotonic time across a jump and otherwise follows the wall clock
(slewing by NTP is far below the tolerance). Jumps are seen while the agent runs; a
clock set while it is stopped is taken as it is.

- link budgets use :meth:`now`: a new budget day needs the time to pass, not the clock
  to move, in either direction;
- age retention uses :meth:`retention_now`, which takes out only *forward* jumps: a
  record must never look older than it is. After a backward jump, records received
  before it expire that much later (never earlier); after a forward jump, records
  received after it do.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from shorelink.logs import get_logger

__all__ = ["JUMP_TOLERANCE_S", "SHIP_CLOCK", "SteadyClock"]

log = get_logger(__name__)

#: wall and monotonic time may disagree by this much (plus 1% of the interval) between
#: two readings before it counts as a jump
JUMP_TOLERANCE_S = 5.0


class SteadyClock:
    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        *,
        tolerance_s: float = JUMP_TOLERANCE_S,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._tolerance = tolerance_s
        self._last: tuple[float, float] | None = None
        #: seconds the wall clock jumped since start (forward positive), in total
        self.skew = 0.0
        #: seconds it jumped forward, in total (what age retention takes out)
        self.forward_skew = 0.0
        self.jumps = 0

    def _read(self) -> float:
        wall, mono = self._wall(), self._monotonic()
        if self._last is not None:
            last_wall, last_mono = self._last
            elapsed = mono - last_mono
            jumped = (wall - last_wall) - elapsed
            if abs(jumped) > self._tolerance + 0.01 * max(elapsed, 0.0):
                self.skew += jumped
                self.forward_skew += max(jumped, 0.0)
                self.jumps += 1
                log.warning(
                    "clock_jump",
                    seconds=round(jumped),
                    skew_s=round(self.skew),
                    message="ages and budget days follow monotonic time across it",
                )
        self._last = (wall, mono)
        return wall

    def now(self) -> float:
        """Epoch seconds, the wall clock's jumps taken out (for budget days)."""
        return self._read() - self.skew

    def retention_now(self) -> float:
        """Epoch seconds for age retention: forward jumps taken out, backward ones not
        (so no record ever looks older than it is)."""
        return self._read() - self.forward_skew


#: the agent process's clock (budgets, retention)
SHIP_CLOCK = SteadyClock()
