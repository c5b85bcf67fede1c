"""A link shaper of the benchmark's own, beside toxiproxy: one bandwidth for all the
connections of a link (``bench/link_drain.py --bandwidth-mode shared``)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

__all__ = ["SharedShaper"]


class SharedShaper:
    """A TCP relay whose bandwidth is shared by all its connections (one virtual clock
    per direction), for ``--bandwidth-mode shared``: toxiproxy's bandwidth toxic limits
    each connection on its own, so ``in_flight`` batches on as many connections get
    ``in_flight`` times the bandwidth. Runs its own event loop in a thread; when the far
    side closes (toxiproxy disabled: an outage) the near side is closed too."""

    CHUNK = 8192

    def __init__(self, listen_port: int, target_port: int, rate: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.rate = rate
        self._next = {"up": 0.0, "down": 0.0}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shaper", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()
        if not self._started.wait(10) or self.error is not None:
            raise RuntimeError(f"shaper did not start: {self.error}")

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported by start() or ignored at stop
            self.error = exc
            self._started.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._relay, "127.0.0.1", self.listen_port)
        self._started.set()
        async with server:
            await self._stop.wait()

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            cw.close()
            return
        pumps = [
            asyncio.create_task(self._pump(cr, uw, "up")),
            asyncio.create_task(self._pump(ur, cw, "down")),
        ]
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for t in pumps:
            t.cancel()
        for w in (cw, uw):
            w.close()

    async def _pump(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, way: str) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await r.read(self.CHUNK):
                now = time.monotonic()
                start = max(now, self._next[way])
                self._next[way] = start + len(data) / self.rate
                await asyncio.sleep(self._next[way] - now)
                w.write(data)
                await w.drain()
