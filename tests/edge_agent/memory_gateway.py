"""An in-memory :class:`edge_agent.gateway.Gateway` that follows the gateway's rules
(``core_gateway/app.py``, ``docs/gateway-api.md``), for tests about the uplink side of
the seam (CONVENTIONS #8): it decodes every batch with the real wire format, holds a
RangeSet per stream, skips seqs it already holds, answers 409 when a batch starts
beyond ``max(contiguous end of written|replicated|abandoned, first_available - 1) + 1``
and records seqs below ``first_available`` as abandoned. Given the ship keys
(``ship_keys``), it proves every batch as a gateway with a ``ship_keys_file`` does and
refuses one its ship's key does not prove (403 ``unsigned``, ``bad_signature``,
``unknown_ship``). It can be told to fail.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from edge_agent.errors import GatewayGap, GatewayRejected, LinkError
from edge_agent.gateway import SendResult
from shorelink.proof import ShipKeys, SignatureError
from shorelink.ranges import RangeSet
from shorelink.wire import WireError, WireRecord, decode_batch, peek_header
from shorelink.wire_dict import Dictionaries

_COLUMNS = ("key", "ts_ms", "topic", "payload")


@dataclass
class Received:
    stream: str
    first: int
    last: int
    first_available: int
    nbytes: int
    outcome: str  # "ok", "gap", "lost_request", "lost_reply", "rejected"
    #: the batch carried its ship's signatures (``FLAG_SIGNED``)
    signed: bool = False


@dataclass
class MemoryGateway:
    site: str
    link: str
    ship: str = "bigblue"
    streams: tuple[str, ...] = ("alerts", "nav", "containers")
    url: str = ""
    #: seconds each call takes (a high-latency link)
    latency: float = 0.0
    #: every call raises LinkError while True (the link is down)
    down: bool = False
    #: call number (1-based, holdings and sends alike) -> "request" (lost on the way:
    #: nothing stored) or "reply" (stored, but the reply is lost)
    fail_calls: dict[int, str] = field(default_factory=dict)
    #: answer every request with this 4xx (status, code)
    reject: tuple[int, str] | None = None
    #: the sites' ship keys: every batch is proved against them (None: not checked)
    ship_keys: ShipKeys | None = None
    #: the batch bodies' dictionaries this site holds (a batch naming another: 422)
    dictionaries: Dictionaries = field(default_factory=Dictionaries)
    #: what the next holdings() answers instead of the truth (a stale view)
    stale_holdings: dict[str, RangeSet] | None = None
    calls: int = 0
    written: dict[str, RangeSet] = field(default_factory=dict)
    abandoned: dict[str, RangeSet] = field(default_factory=dict)
    replicated: dict[str, RangeSet] = field(default_factory=dict)
    records: dict[str, dict[int, WireRecord]] = field(default_factory=dict)
    #: how often each (stream, seq) arrived in a batch
    arrivals: Counter[tuple[str, int]] = field(default_factory=Counter)
    #: seqs the ship was told (in an accepting reply) this site holds
    confirmed: dict[str, RangeSet] = field(default_factory=dict)
    #: (stream, seq) that arrived again after the ship had been told it was held
    resent_after_confirm: list[tuple[str, int]] = field(default_factory=list)
    log: list[Received] = field(default_factory=list)
    closed: bool = False

    def __post_init__(self) -> None:
        self.url = self.url or f"memory://{self.site}/{self.link}"

    def held(self, stream: str) -> RangeSet:
        out = self.written.get(stream, RangeSet()).copy()
        out.update(self.replicated.get(stream, RangeSet()))
        return out

    def records_transmitted(self) -> int:
        """Records in every batch that reached the wire, whatever became of it."""
        return sum(r.last - r.first + 1 for r in self.log)

    def bytes_received(self) -> int:
        return sum(r.nbytes for r in self.log)

    async def _call(self) -> str:
        self.calls += 1
        number = self.calls
        if self.latency:
            await asyncio.sleep(self.latency)
        if self.down:
            raise LinkError("connection refused", site=self.site)
        if self.reject is not None:
            status, code = self.reject
            raise GatewayRejected(status, code, "refused", site=self.site)
        return self.fail_calls.get(number, "")

    # -- the Gateway protocol ---------------------------------------------------------------
    async def holdings(self) -> dict[str, RangeSet]:
        if await self._call():
            raise LinkError("connection reset", site=self.site)
        if self.stale_holdings is not None:
            stale, self.stale_holdings = self.stale_holdings, None
            return {s: stale.get(s, self.held(s)).copy() for s in self.streams}
        for s in self.streams:
            self.confirmed[s] = self.held(s)
        return {s: self.held(s) for s in self.streams}

    async def send(self, stream: str, body: bytes) -> SendResult:
        fail = await self._call()
        try:
            batch = decode_batch(body, dictionaries=self.dictionaries)
        except WireError as exc:
            if exc.reason != "unknown_dictionary":
                raise
            h = peek_header(body)
            self.log.append(Received(stream, h.first_seq, h.last_seq, 0, len(body), "rejected"))
            raise GatewayRejected(
                422, exc.reason, str(exc), site=self.site, stream=stream
            ) from None
        assert batch.origin == self.ship and batch.stream == stream
        rec = Received(
            stream,
            batch.first_seq,
            batch.last_seq,
            batch.first_available,
            len(body),
            "",
            bool(batch.signatures),
        )
        self.log.append(rec)
        if fail == "request":
            rec.outcome = "lost_request"
            raise LinkError("connection reset while sending", site=self.site)
        if stream not in self.streams:
            rec.outcome = "rejected"
            raise GatewayRejected(404, "unknown_stream", stream, site=self.site, stream=stream)
        if self.ship_keys is not None:
            columns = [[getattr(r, f) for r in batch.records] for f in _COLUMNS]
            try:
                self.ship_keys.prove_batch(
                    batch.origin, stream, batch.first_seq, columns, batch.signatures
                )
            except SignatureError as exc:
                rec.outcome = "rejected"
                raise GatewayRejected(
                    403, exc.reason, str(exc), site=self.site, stream=stream
                ) from None
        written = self.written.setdefault(stream, RangeSet())
        abandoned = self.abandoned.setdefault(stream, RangeSet())
        settled = self.held(stream)
        settled.update(abandoned)
        end = settled.contiguous_end()
        if batch.first_seq > max(end, batch.first_available - 1) + 1:
            rec.outcome = "gap"
            raise GatewayGap(self.held(stream), "resend", site=self.site, stream=stream)
        confirmed = self.confirmed.get(stream, RangeSet())
        for r in batch.records:
            self.arrivals[(stream, r.seq)] += 1
            if r.seq in confirmed:
                self.resent_after_confirm.append((stream, r.seq))
        new = [r for r in batch.records if r.seq not in settled]
        if batch.first_available - 1 > end:
            abandoned.add_range(end + 1, batch.first_available - 1)
        for r in new:
            written.add(r.seq)
            self.records.setdefault(stream, {})[r.seq] = r
        if fail == "reply":
            rec.outcome = "lost_reply"
            raise LinkError("connection reset before the reply", site=self.site)
        rec.outcome = "ok"
        held = self.held(stream)
        self.confirmed[stream] = held.copy()
        return SendResult(held, len(body), RangeSet.from_seqs(r.seq for r in new))

    async def reset(self) -> None:
        pass

    async def close(self) -> None:
        self.closed = True
