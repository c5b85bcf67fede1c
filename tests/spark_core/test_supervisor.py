"""The site's supervisor (spark_core/jobs/site.py) on real streaming queries: a query
runs while it is wanted, is parked when it is not, and stays parked until it is wanted
again (a parked query used to be started again in the same loop: a start and a stop
every two seconds for as long as its route pointed elsewhere); and the scheduler pools
its queries run in."""

from __future__ import annotations

import threading
from typing import Any
from xml.etree import ElementTree

from spark_core.jobs.site import QueryRunner, Supervisor
from spark_core.replication import BULK_POOL, URGENT_POOL
from spark_core.session import SCHEDULER_CONF
from tests.helpers import eventually


def test_a_query_runs_while_wanted_and_stays_parked_while_not(spark: Any) -> None:
    wanted = threading.Event()
    wanted.set()
    starts: list[Any] = []

    def start() -> Any:
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 5)
            .load()
            .writeStream.format("noop")
            .trigger(processingTime="200 milliseconds")
            .start()
        )
        starts.append(query)
        return query

    runner = QueryRunner(
        name="rate",
        start=start,
        stop_gracefully=lambda query: query.stop(),
        on_failure=lambda error: None,
        wanted=wanted.is_set,
    )
    sup = Supervisor([runner])
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    try:
        eventually(lambda: runner.query is not None and runner.query.isActive, 60, "started")
        wanted.clear()
        eventually(lambda: runner.query is None, 60, "parked")
        stops = len(starts)
        loops = 6  # the supervisor looks every 0.5 s: three seconds of chances to restart
        for _ in range(loops):
            sup.wait_idle(0.5)
            assert runner.query is None and len(starts) == stops, "a parked query ran again"
        assert not any(q.isActive for q in starts)
        wanted.set()
        eventually(lambda: runner.query is not None and runner.query.isActive, 60, "again")
        assert len(starts) == stops + 1
    finally:
        sup.request_stop()
        thread.join(60)
    assert not thread.is_alive() and not any(q.isActive for q in starts)


def test_the_pools_file_names_the_pools_the_queries_run_in_urgent_first(spark: Any) -> None:
    """spark_core/pools.xml declares the two pools replication and the merge use, the
    urgent one served first; the session the site runs in has read it."""
    root = ElementTree.parse(SCHEDULER_CONF["spark.scheduler.allocation.file"]).getroot()
    pools = {p.get("name"): p for p in root.iter("pool")}
    assert set(pools) == {URGENT_POOL, BULK_POOL}
    weight = {n: int(p.findtext("weight") or 1) for n, p in pools.items()}
    share = {n: int(p.findtext("minShare") or 0) for n, p in pools.items()}
    assert weight[URGENT_POOL] > weight[BULK_POOL] and share[URGENT_POOL] >= 1
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.scheduler.mode") == "FAIR"
    assert conf.get("spark.scheduler.allocation.file") == str(
        SCHEDULER_CONF["spark.scheduler.allocation.file"]
    )
    pool = spark.sparkContext._jsc.sc().getPoolForName(URGENT_POOL)
    assert pool.isDefined() and pool.get().minShare() == share[URGENT_POOL]
