"""Sealing: encoding a stream's records into batch bodies before any link needs them.

A ship spends most of its time at sea with a spare core, and arrives in port with a
backlog to send over a link that may be up for minutes. Reading and encoding that
backlog when the link comes up costs about 8 µs per record (bench/link_drain.py:
``agent_build_ms_mean``), more than a 2 Mbit/s port link needs to stay busy at ~2 bytes
per record. So the agent seals as it goes: once ``uplink.seal_records`` records of a
stream (50,000 by default, the port links' batch size) are committed beyond the last
segment, they are encoded once (the batch builder's child process, when no batch is
waiting to be sent) and kept in the log's ``segments`` table (about 2% of the records'
payload bytes). A link that can take a segment whole sends it with a fresh header
(edge_agent/batching.py); smaller links (satellite) and the records since the last
segment are encoded when sent, as before.

With a signing key (``uplink.signing_key_file``) a segment is signed as it is sealed
(its chunks' signatures kept beside its body, framed into the header when sent), and
so is every batch encoded when sent. Signing costs about 1.5-2 µs a record on top of
the encoding (``encode_body`` with and without its ``signer``, 50,000 records of
container telemetry): mostly the records' hashes, plus one Ed25519 signature (30-60 µs)
per chunk of ``CHUNK_RECORDS`` records (bench/signatures.py measures it); sealing pays
it at sea. Segments sealed unsigned or with another key are never sent
(edge_agent/segments.py): the sealer drops them when it starts and seals those records
again, signed.

A segment is a cache, never the truth: it is written only if every one of its records
is still in the log (checked in the same transaction), retention deletes it with any of
its records, and a batch framed from it carries exactly the bytes the records would
encode to. Sealing is idempotent (one segment per first seq), so a crash costs at most
the segment being encoded.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from functools import partial

from edge_agent.batching import BatchBuilder, BuildFailed, SealSpec
from edge_agent.config import EdgeConfig
from edge_agent.errors import LogError
from edge_agent.log import EdgeLog
from edge_agent.metrics import EdgeMetrics
from shorelink.logs import RateLimitedLog, get_logger
from shorelink.wire import DEFAULT_LIMITS, WireError

__all__ = ["Sealer"]

log = get_logger(__name__)

#: payload bytes one segment reads at most (a segment of large records holds fewer)
SEAL_MAX_BYTES = DEFAULT_LIMITS.max_compressed_bytes
#: a segment is kept only if its body is at most this part of its records' bytes: that
#: bounds what segments add to the log's disk use (container telemetry: about 2%), and
#: records that do not compress gain nothing from it (the link, not the encoder, is
#: their bottleneck); such a run is skipped and encoded when sent
MAX_SEGMENT_RATIO = 0.1


class Sealer:
    def __init__(
        self, cfg: EdgeConfig, edge_log: EdgeLog, builder: BatchBuilder, metrics: EdgeMetrics
    ) -> None:
        self.records = cfg.uplink.seal_records
        self.interval_s = cfg.uplink.seal_interval_s
        self.log = edge_log
        self.builder = builder
        self.metrics = metrics
        self.streams = [s.name for s in cfg.by_priority()]
        #: streams whose next records cannot be sealed (a record the format cannot
        #: carry): skipped until the agent restarts; they are still sent, encoded then
        self._stuck: set[str] = set()
        #: per stream, where sealing goes on after runs that did not compress (not
        #: persisted: after a restart such a run is encoded once more, then skipped)
        self._skip_to: dict[str, int] = {}
        self._limited = RateLimitedLog(log)

    async def run(self, stop: asyncio.Event) -> None:
        """Seal what is due, then look again every ``seal_interval``, until ``stop``."""
        try:
            await asyncio.to_thread(self.drop_foreign)
        except LogError as exc:  # such segments are only skipped when sending (and kept)
            log.warning("segments_drop_failed", error=str(exc))
        if not self.records:
            return
        while not stop.is_set():
            try:
                await self.seal_due(stop)
            except (BuildFailed, LogError) as exc:  # the next pass tries again
                self._limited.warning("seal", "seal_failed", error=str(exc))
            await asyncio.to_thread(self.update_gauges)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)

    def drop_foreign(self) -> int:
        """Drop the segments not sealed with the key of now (unsigned ones when a key is
        configured, or another key's): they would never be sent, and while they stand
        the records they hold are not sealed again. Return how many."""
        dropped = self.log.segments.keep_only(self.builder.signer)
        if dropped:
            log.info(
                "segments_dropped",
                count=dropped,
                reason="unsigned_or_another_key" if self.builder.signer else "signed_but_no_key",
            )
        return dropped

    async def seal_due(self, stop: asyncio.Event | None = None) -> int:
        """Seal every whole segment that is due; return how many were sealed."""
        sealed = 0
        for stream in self.streams:
            while stream not in self._stuck and not (stop is not None and stop.is_set()):
                step = await self._seal_next(stream)
                if step is None:
                    break
                sealed += step
        return sealed

    async def _seal_next(self, stream: str) -> int | None:
        """Seal the next segment of ``stream``: 1 if one was stored, 0 if a run was
        skipped (it did not compress), None if there is nothing to seal now."""
        last = self.log.stream_state(stream).next_seq - 1
        start = max(await asyncio.to_thread(self._unsealed, stream), self._skip_to.get(stream, 0))
        if last - start + 1 < self.records:
            return None
        t0 = time.monotonic()
        epoch = self.log.numbering_epoch
        try:
            body = await self.builder.seal(
                SealSpec(stream, start, last, self.records, SEAL_MAX_BYTES)
            )
        except WireError as exc:
            self._stuck.add(stream)
            log.error("seal_unencodable", stream=stream, start=start, error=str(exc))
            return None
        if body is None:
            return None
        if len(body.data) > body.decoded_len * MAX_SEGMENT_RATIO:
            self._skip_to[stream] = body.first_seq + body.count
            self._limited.warning(
                f"incompressible:{stream}",
                "seal_skipped",
                stream=stream,
                seqs=f"{body.first_seq}-{body.first_seq + body.count - 1}",
                bytes=len(body.data),
                of=body.decoded_len,
                reason="incompressible",
            )
            return 0
        if not await asyncio.to_thread(
            partial(self.log.segments.add, stream, body, epoch, signer=self.builder.signer)
        ):
            return None  # retention took some of its records meanwhile: next pass
        self.metrics.seal_seconds.observe(time.monotonic() - t0)
        self.metrics.sealed_records.labels(stream).inc(body.count)
        log.debug(
            "segment_sealed",
            stream=stream,
            seqs=f"{body.first_seq}-{body.first_seq + body.count - 1}",
            bytes=len(body.data),
        )
        return 1

    def _unsealed(self, stream: str) -> int:
        """The first seq after the last segment that is still on board."""
        return max(self.log.segments.sealed_upto(stream) + 1, self.log.first_seq(stream))

    def update_gauges(self) -> None:
        totals = self.log.segments.totals()
        for stream in self.streams:
            self.metrics.segment_records.labels(stream).set(totals.get(stream, (0, 0, 0))[1])
