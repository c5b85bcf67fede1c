"""``shorelink-spark topics apply`` and ``access apply`` as text (spark_core/cli.py):
every line fits 80 columns (a terminal, or piped) and every figure and name is whole,
for the changes the real planners make for sites and streams with long names. Against a
broker: test_topics.py and test_access.py."""

from __future__ import annotations

import re
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_core.access import AccessChanges, plan_access
from spark_core.cli import render_access_changes, render_topic_changes
from spark_core.config import SitesConfig, parse_config
from spark_core.topics import TopicState, plan_changes, site_specs
from tests.strategies import DIGITS, LOWER, words

names = words(LOWER, LOWER + DIGITS + "-", 40)


def _sites(site: str, neighbour: str, streams: list[str], partitions: int) -> SitesConfig:
    policy = {s: {"partitions": partitions, "retention": "7d"} for s in streams}
    return parse_config(
        {
            "staff": [{"username": f"ops-{site}", "password": "ops-pw"}],
            "sites": {
                site: {
                    "streams": streams,
                    "neighbours": [neighbour],
                    "checkpoint_dir": "c",
                    "table_dir": "t",
                    "kafka": {"bootstrap": "kafka.example.net:9093", "password": "spark-pw"},
                    "access": {"admin_password": "admin-pw", "gateway_password": "gw-pw"},
                    "replication": {"password": f"{site}-pw"},
                    "topics": policy,
                },
                neighbour: {
                    "streams": streams,
                    "neighbours": [site],
                    "checkpoint_dir": "c",
                    "table_dir": "t",
                    "kafka": {"bootstrap": "127.0.0.1:1"},
                    "replication": {"password": f"{neighbour}-pw"},
                },
            },
        }
    )


def _fits_and_whole(lines: list[str], figures: list[str], words: list[str]) -> None:
    assert all(len(line) <= 80 for line in lines), [ln for ln in lines if len(ln) > 80]
    # a figure split over two lines would count as two other figures
    shown = Counter(re.findall(r"\d+", "\n".join(lines)))
    assert shown >= Counter(re.findall(r"\d+", " ".join(figures)))
    on_lines = set(re.split(r"[\s,]+", "\n".join(lines)))
    for w in words:
        # a name longer than a line (a topic of two 41-character names) is cut
        assert w in on_lines or len(w) > 76, w


@settings(max_examples=60, deadline=None)
@given(
    st.lists(names, min_size=2, max_size=2, unique=True),
    st.lists(names, min_size=1, max_size=3, unique=True),
    st.integers(1, 1000),
    st.booleans(),
)
def test_topics_apply_fits_80_columns_and_every_topic_and_figure_is_whole(
    sites: list[str], streams: list[str], partitions: int, dry_run: bool
) -> None:
    site, neighbour = sites
    specs = site_specs(_sites(site, neighbour, streams, partitions), site)
    # half the topics exist, with another retention and fewer partitions
    existing = {
        s.name: TopicState(1, 1, {"retention.ms": "86400000", "cleanup.policy": "delete"})
        for s in specs[::2]
    }
    changes = plan_changes(specs, existing, 3, 2)
    lines = render_topic_changes(site, "kafka.example.net:9093", changes, dry_run, 80)
    figures = [c.detail for c in changes]
    _fits_and_whole(lines, figures, [c.topic for c in changes])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(names, min_size=2, max_size=2, unique=True),
    st.lists(names, min_size=1, max_size=3, unique=True),
    st.booleans(),
)
def test_access_apply_fits_80_columns_and_every_grant_is_whole(
    sites: list[str], streams: list[str], dry_run: bool
) -> None:
    site, neighbour = sites
    cfg = _sites(site, neighbour, streams, 1)
    plan = plan_access(cfg, site)
    grants = sorted(plan.grants)
    changes = AccessChanges(
        site, sorted(plan.users), [f"ops-{site}"], grants[1:], grants[:1], unchanged=10**12
    )
    lines = render_access_changes("kafka.example.net:9093", len(plan.users), changes, dry_run, 80)
    _fits_and_whole(lines, [], [w for g in grants for w in str(g).split()])
    assert len(lines) >= len(changes.lines()) + 1
    unchanged = render_access_changes("k:9093", 10**9, AccessChanges(site, unchanged=10**12), False)
    _fits_and_whole(unchanged, [str(10**9), str(10**12)], [f"{site}:"])
