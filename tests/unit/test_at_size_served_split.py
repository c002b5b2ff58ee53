"""benchmarks.at_size.served_split's arithmetic: cores per process group between two snapshots,
the engine's share of a burst from its step profile, and a burst's split."""

from __future__ import annotations

import pytest

from benchmarks.at_size.served_split import (
    LOAD,
    REPLICA_TITLE,
    cores_between,
    engine_between,
    medians,
    split_burst,
    title_group,
)


@pytest.mark.parametrize(
    ("title", "group"),
    [
        ("ray::ServeReplica:edge:glm", "ray::ServeReplica:edge:glm"),
        ("ray::ServeController ", "ray::ServeController"),
        ("/venv/lib/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp/x", "gcs_server"),
        ("/usr/sbin/haproxy -db -f /tmp/h.cfg", "haproxy"),
    ],
)
def test_a_process_is_grouped_by_its_ray_title_or_its_program(title, group):
    assert title_group(title) == group


def test_cores_count_only_processes_seen_at_both_ends_and_sum_a_group():
    before = {1: ("ray::router", 10.0), 2: ("ray::router", 4.0), 3: ("gcs_server", 1.0)}
    after = {
        1: ("ray::router", 11.0),
        2: ("ray::router", 5.0),
        3: ("gcs_server", 1.001),  # under SHOWN_CORES over 2 s: left out
        4: ("ray::ServeController", 50.0),  # started meanwhile: its whole life is not the burst's
    }
    assert cores_between(before, after, wall_s=2.0) == {"ray::router": 1.0}


def test_the_engine_side_of_a_burst_is_its_profile_difference_over_the_burst():
    before = {"steps": 10, "graph_s": 1.0, "wall_s": 1.5}
    after = {"steps": 30, "graph_s": 3.0, "wall_s": 5.5}
    assert engine_between(before, after, wall_s=4.0) == {
        "steps": 20,
        "busy_share": 1.0,
        "graph_share": 0.5,
        "graph_ms_per_step": 100.0,
    }


def test_a_burst_splits_the_replica_from_the_rest_and_leaves_the_load_out():
    cpu_before = {1: (REPLICA_TITLE, 0.0), 2: ("ray::router", 0.0), 3: (LOAD, 0.0)}
    cpu_after = {1: (REPLICA_TITLE, 8.0), 2: ("ray::router", 1.0), 3: (LOAD, 0.5)}
    engine = (
        {"steps": 0, "graph_s": 0.0, "wall_s": 0.0},
        {"steps": 40, "graph_s": 3.6, "wall_s": 4.0},
    )
    split = split_burst(5.0, 640, engine, (cpu_before, cpu_after))
    assert split["tokens_per_s"] == 128.0
    assert split["replica_cores"] == 1.6
    assert split["others_cores"] == 0.2  # the router; the driver's load is its own line
    assert split["cores"] == {REPLICA_TITLE: 1.6, "ray::router": 0.2, LOAD: 0.1}
    assert split["engine"]["graph_ms_per_step"] == 90.0
    assert (
        medians([split, {**split, "tokens_per_s": 100.0}, {**split, "tokens_per_s": 90.0}])[
            "tokens_per_s"
        ]
        == 100.0
    )
