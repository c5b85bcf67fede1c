"""Dead letters whose cause can change, tried again when it does (replication review
N4, security review N6, issue 40's quarantine).

A merge quarantines what it cannot write in ``sl.dead.<stream>`` with its cause
(spark_core/quarantine.py) and its cursor passes it: the record is not read again from
its source. Two causes can change, and without this such a record stays lost at that
site for good, while its status says lag 0:

- **The ship keys file** (:func:`shorelink.proof.key_cause`: a ship with no key where
  keys are required, a record without a proof, a proof no key of the ship verifies, a
  revoked key past its bound): the file can change and prove it: a ship's key added at
  one site minutes after another (the file reaches sites at different times), a key
  given to a ship that signed before, a key's history mended. Tried again when the
  file's fingerprint differs from the one the last complete pass ran under
  (``MergeState.redrive_keys``): a merge that starts with another file (changed while it
  was down) re-drives once; one that starts with the same file does not.
- **The bound on holes** (``MAX_HOLDINGS_RANGES`` ranges in one ship's ledger entry):
  the entry's holes fill as the records between them arrive. The merge keeps the seqs it
  held back (``MergeState.held_back``; the sources by name in its marker: a restarted
  merge tries them once) and passes again once one of them can be taken and could not
  when the last pass ended (:func:`~spark_core.merge_state.takeable`: the entry holds at
  most :data:`HOLES_ROOM` of the bound, or a seq next to it; the records held back are
  often the very ones that fill its holes). Not on any change of the entry: a ship
  writing at the bound changes it at every batch, and each look copied its held-back
  records once more, for good (review 9, finding 1). One that still looks takeable when
  a pass ends (the room went to another, its dead letter is gone) waits a back-off per
  source (``HOLES_BACKOFF_S``, doubling to ``HOLES_BACKOFF_MAX_S``): no pass follows
  another unless something could be taken in between.

The rest (a record that breaks the contract, one over the size limit) stay where they
are, counted per cause: no change here proves them.

- **From where.** From the re-drive's own offsets in the merge's marker, kept like a
  neighbour's cursor under the source ``~redrive/<topic id>/sl.<stream>`` (no site is
  named ``~redrive``; the topic id ties it to that incarnation of the topic), up to
  where the dead-letter topic ended when the change was noticed: each pass reads
  what was dead-lettered since the last one, never the whole topic again.
- **How.** Every dead letter of a cause that can change, whichever change started the
  pass, planned again as pulled records (``Merger.write_redriven``): with the keys in
  force now, against the ledger, in one transaction with the re-drive's offsets. What
  the site holds already is a duplicate and dropped; what is proved now and fits is
  written once (and relayed under the entry its ``sl.site`` names, as history is); what
  is still refused is dead-lettered again, after the offsets, so the next change tries
  it again. Each pass costs one copy of each record still refused; the dead-letter
  topic's retention bounds what is kept.
- **How much at a time.** At most :data:`PASS_RECORDS` records or :data:`PASS_BYTES`
  bytes per transaction, the merge's lock released between them.

Counted per cause and outcome (``written``: taken now; ``duplicate``: held already;
``refused``: still refused) in the merge's totals (``redriven``), the metric
``shorelink_spark_redriven_records_total{merge,cause,outcome}`` and the log
(``event=dead_letters_redriven``, with what started the pass).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shorelink.contract import H_ORIGIN, H_SEQ, H_STREAM, canonical_topic, dead_topic
from shorelink.kafka.errors import KafkaClientError
from shorelink.kafka.reading import read_to_end
from shorelink.logs import get_logger
from shorelink.retry import Backoff
from spark_core.merge_state import (
    HOLES_ROOM,
    BatchPlan,
    MergeError,
    MergeState,
    SourceRow,
    pulled_source,
    takeable,
)
from spark_core.quarantine import H_DEAD_HEADERS, REDRIVE, RETRIED_CAUSES, dead_cause

if TYPE_CHECKING:
    from spark_core.merge import Merger

__all__ = [
    "FAIL_BACKOFF",
    "HOLES_ROOM",
    "PASS_BYTES",
    "PASS_RECORDS",
    "REDRIVE",
    "Redriver",
    "redrive_once",
    "redrive_source",
    "retry_row",
]

log = get_logger(__name__)

#: dead letters planned again in one transaction at most, and their bytes
PASS_RECORDS = 5_000
PASS_BYTES = 32 * 1024 * 1024
#: how often the re-driver looks at each merge's ship keys and held back sources (the
#: file is looked at once a second by :class:`~shorelink.proof.WatchedShipKeys`)
LOOK_S = 1.0
#: after failed looks at a merge, how long until the next (doubling while it fails)
FAIL_BACKOFF = Backoff(first_s=2.0, cap_s=60.0)


def redrive_source(topic_id: str, stream: str) -> str:
    """The source under which a merge keeps its re-drive's offsets in
    ``sl.dead.<stream>`` (topic ``topic_id``): a neighbour's canonical topic's form,
    so its records are proved as pulled ones and relayed under the entry they name."""
    return pulled_source(REDRIVE, topic_id, canonical_topic(stream))


def retry_row(
    source: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Any,
) -> tuple[SourceRow, str] | None:
    """A dead letter as the row to plan again and its cause, if a change can lift it
    (:data:`~spark_core.quarantine.RETRIED_CAUSES`); None for any other. The row has the
    record's own headers, without the dead-letter ones."""
    hs = list(headers or ())
    cause = dead_cause(hs)
    if cause not in RETRIED_CAUSES or value is None:
        return None
    kept = [(k, v) for k, v in hs if k not in H_DEAD_HEADERS]
    return SourceRow(source, partition, offset, key, value, kept), cause


def _identity(headers: Iterable[tuple[str, Any]]) -> tuple[Any, Any, Any]:
    h = {k: v for k, v in headers if k in (H_ORIGIN, H_STREAM, H_SEQ)}
    return h.get(H_ORIGIN), h.get(H_STREAM), h.get(H_SEQ)


def tally(rows: Sequence[tuple[SourceRow, str]], plan: BatchPlan) -> dict[str, Counter[str]]:
    """Per cause (the dead letter's), how many were ``written`` (proved now),
    ``duplicate`` (held already) and ``refused`` (dead-lettered again)."""
    cause_of: dict[tuple[Any, Any, Any], str] = {}
    tried: Counter[str] = Counter()
    for row, cause in rows:
        cause_of.setdefault(_identity(row.headers), cause)
        tried[cause] += 1
    out: dict[str, Counter[str]] = {c: Counter() for c in tried}
    for _, _, _, headers in plan.canonical:
        out[cause_of.get(_identity(headers), "unknown")]["written"] += 1
    for _, _, _, headers in plan.dead:
        out[cause_of.get(_identity(headers), "unknown")]["refused"] += 1
    for cause, n in tried.items():
        settled = sum(out[cause].values())
        if n > settled:
            out[cause]["duplicate"] += n - settled
    return out


@dataclass
class _Pass:
    """A re-drive under way: the keys it runs under, the merge's commit when it started,
    what started it, and where the topics ended."""

    keys_mark: str | None
    since: int
    why: str
    #: per re-drive source partition: where its dead-letter topic ended
    ends: dict[tuple[str, int], int]
    #: source name -> dead-letter topic
    topics: dict[str, str]
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    read: int = 0


def _why(state: MergeState, keys_mark: str | None, max_ranges: int, now: float) -> str | None:
    """What calls for a pass now: ``keys`` (the ship keys changed since the last pass),
    ``holes`` (records held back at the bound on holes can be taken now and could not
    when the last pass ended, or could then and their back-off is over; the marker
    named a source or said ``*``: once after a start), or None."""
    if keys_mark != state.redrive_keys:
        return "keys"
    for src, hb in state.held_back.items():
        if hb.unknown:
            return "holes"
        can = takeable(hb.seqs, state.held_for(src), max_ranges)
        if can and (not hb.looked.contains_all(can) or now >= hb.due):
            return "holes"
    return "holes" if state.held_back_all else None


def _start(merger: Merger) -> _Pass | None:
    """Whether a pass is called for, the keys now and the merge's commit (under its lock:
    no batch half planned with older keys or a fuller ledger), then where the merge's
    dead-letter topics end (after: Kafka's admin calls never hold the lock, whose
    batches would wait out their timeout when a broker does not answer; review 9,
    finding 5). The ends, asked after the commit, hold every dead letter it wrote;
    those of a batch in between are read too and tried, no harm). They are the high
    watermarks, not the last stable offsets: a transaction's commit returns before the
    broker has written its markers, so the last stable offset asked right after it can
    still end before that transaction's dead letters, and a pass that ended there
    marked them tried under keys they were never planned with (CI found it: a site
    that took a replaced ship key a moment after it dead-lettered the new key's records
    never took them). Records above the ends' commit are of batches planned under the
    keys of this pass or later. None when nothing is to be done."""
    if merger.ship_keys is None and not merger.state.held_back_or_all:
        return None  # nothing can change: no lock taken
    with merger.busy:
        watched = merger.ship_keys
        state = merger.state
        if state.last_batch is None or merger.stopping.is_set():
            return None  # nothing committed yet: nothing dead-lettered by this merge
        keys_mark = None if watched is None else watched.current().fingerprint()
        why = _why(state, keys_mark, merger.max_ranges, time.monotonic())
        if why is None:
            return None
        since = merger.commits
        topics = [dead_topic(s) for s in merger.streams]
        merger.admin()  # made under the lock, used outside it
    marks = merger._relay_marks(topics, committed=False)
    ends: dict[tuple[str, int], int] = {}
    sources: dict[str, str] = {}
    for topic, (topic_id, parts) in marks.items():
        if not topic_id:
            continue  # never written
        source = redrive_source(topic_id, topic.removeprefix("sl.dead."))
        sources[source] = topic
        ends.update({(source, p): end for p, end in parts.items()})
    return _Pass(keys_mark, since, why, ends, sources)


def _step(merger: Merger, run: _Pass) -> bool:
    """One transaction's worth of the pass; True once it reached the ends."""
    cursors = merger.state.offsets
    todo = {tp: end for tp, end in run.ends.items() if cursors.get(tp, 0) < end}
    reached: dict[tuple[str, int], int] = {}
    rows: list[tuple[SourceRow, str]] = []
    full = False  # stopped at the bound of a transaction, not at the ends
    if todo:
        by_topic = {run.topics[s]: s for s, _ in todo}
        # every partition of the topics read from its cursor (one without dead letters
        # since is read from its end on, not from its start)
        starts = {
            (run.topics[s], p): cursors.get((s, p), 0)
            for s, p in run.ends
            if run.topics[s] in by_topic
        }
        size = 0
        open_parts = set(todo)
        # settled: up to the high watermarks, once every transaction below them is
        # committed or aborted (the ends above are high watermarks: a read that ended
        # at an older last stable offset would pass a batch's dead letters unread)
        read = read_to_end(merger.site.kafka, sorted(by_topic), starts=starts, settled=True)
        for msg in read:
            tp = (by_topic[msg.topic() or ""], msg.partition())
            offset = msg.offset() or 0
            if tp not in open_parts or offset >= todo[tp]:
                open_parts.discard(tp)
            else:
                reached[tp] = offset + 1
                run.read += 1
                got = retry_row(tp[0], tp[1], offset, msg.key(), msg.value(), msg.headers())
                if got is not None:
                    rows.append(got)
                    size += len(got[0].value or b"") + len(got[0].key or b"")
                if offset + 1 >= todo[tp]:
                    open_parts.discard(tp)
                if len(rows) >= PASS_RECORDS or size >= PASS_BYTES:
                    full = True
                    break
            if not open_parts:
                break
    if not full:  # every partition read to its end: past transaction markers and
        # records retention deleted too, nothing below the ends is left
        reached = {tp: max(reached.get(tp, 0), end) for tp, end in todo.items()}
    finished = None if full else (run.keys_mark, run.since)
    plan = merger.write_redriven([r for r, _ in rows], reached, finished)
    for cause, n in tally(rows, plan).items():
        run.counts.setdefault(cause, Counter()).update(n)
    return not full


def redrive_once(merger: Merger) -> dict[str, Counter[str]] | None:
    """If a cause of the merge's dead letters changed since they were last tried (its
    ship keys; room in an entry held back at the bound on holes): try them again, to
    where the dead-letter topics end now. Returns the counts per cause and outcome,
    None when there was nothing to do."""
    run = _start(merger)
    if run is None:
        return None
    while not _step(merger, run):
        pass
    totals = merger.totals.redriven
    for cause, n in run.counts.items():
        for outcome, k in n.items():
            totals[f"{cause}:{outcome}"] = totals.get(f"{cause}:{outcome}", 0) + k
    merger.totals.redrive_passes += 1
    if not merger.stopping.is_set():
        merger.write_status("running")  # the counts in the status file at once
    log.info(
        "dead_letters_redriven",
        site=merger.site.name,
        query=merger.query,
        why=run.why,
        read=run.read,
        written=sum(n["written"] for n in run.counts.values()),
        duplicate=sum(n["duplicate"] for n in run.counts.values()),
        refused=sum(n["refused"] for n in run.counts.values()),
        causes=",".join(
            f"{c}:{o}={k}" for c, n in sorted(run.counts.items()) for o, k in sorted(n.items())
        )
        or "-",
        keys=run.keys_mark or "-",
    )
    return run.counts


class Redriver:
    """The site's re-drive loop: every :data:`LOOK_S`, each merge
    (:func:`redrive_once`). A failure is logged (once per new error) and the merge is
    tried again after :data:`FAIL_BACKOFF` (2 s, doubling while it fails, up to 60 s):
    a Kafka that does not answer is not asked every second
    (review 9, finding 5). Whatever it raises, the loop goes on (finding 9: an
    unexpected error stopped it for good, silently)."""

    def __init__(self, mergers: Sequence[Merger]) -> None:
        self.mergers = list(mergers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redrive", daemon=True)
        #: the last failure, per merge query (None: the last look went through)
        self.errors: dict[str, str | None] = {}
        #: per merge query after a failure: its failures in a row, and when it is
        #: looked at again
        self._backoff: dict[str, tuple[int, float]] = {}

    def start(self) -> None:
        if self.mergers:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(LOOK_S):
            for m in self.mergers:
                if m.stopping.is_set() or m.fenced is not None:
                    continue
                if time.monotonic() < self._backoff.get(m.query, (0, 0.0))[1]:
                    continue
                try:
                    redrive_once(m)
                except (MergeError, KafkaClientError) as exc:
                    self._failed(m, exc, expected=True)
                except Exception as exc:  # never let the loop die: log and go on
                    self._failed(m, exc, expected=False)
                else:
                    self.errors[m.query] = None
                    self._backoff.pop(m.query, None)

    def _failed(self, m: Merger, exc: Exception, *, expected: bool) -> None:
        failures = self._backoff.get(m.query, (0, 0.0))[0] + 1
        backoff = FAIL_BACKOFF.delay(failures)
        self._backoff[m.query] = (failures, time.monotonic() + backoff)
        error = f"{type(exc).__name__}: {exc}" if not expected else str(exc)
        if self.errors.get(m.query) != error:  # once per new error
            fields = {"site": m.site.name, "query": m.query, "error": error, "retry_s": backoff}
            if expected:
                log.warning("redrive_failed", **fields)
            else:
                log.exception("redrive_failed", **fields)
        self.errors[m.query] = error
