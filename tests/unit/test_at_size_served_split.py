"""benchmarks.at_size.served_split's arithmetic: cores per process group between two snapshots,
the engine's share of a burst from its step profile, and a burst's split."""

from __future__ import annotations

from benchmarks.at_size.served_split import (
    LOAD,
    REPLICA_TITLE,
    cores_between,
    engine_between,
    medians,
    split_burst,
)


def test_cores_count_only_processes_seen_at_both_ends_and_sum_a_title():
    titles = {1: "ray::router", 2: "ray::router", 3: "gcs_server", 4: "ray::ServeController"}
    before = ({1: 10.0, 2: 4.0, 3: 1.0}, titles)
    after = (
        # gcs_server: under SHOWN_CORES over 2 s, left out; the controller's process 4 started
        # meanwhile: its whole life is not the burst's.
        {1: 11.0, 2: 5.0, 3: 1.001, 4: 50.0},
        titles,
    )
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
    titles = {1: REPLICA_TITLE, 2: "ray::router", 3: LOAD, 4: "raylet"}
    cpu_before = ({1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, titles)
    cpu_after = ({1: 8.0, 2: 1.0, 3: 0.5, 4: 0.02}, titles)  # the raylet: under SHOWN_CORES
    engine = (
        {"steps": 0, "graph_s": 0.0, "wall_s": 0.0},
        {"steps": 40, "graph_s": 3.6, "wall_s": 4.0},
    )
    split = split_burst(5.0, 640, engine, (cpu_before, cpu_after))
    assert split["tokens_per_s"] == 128.0
    assert split["replica_cores"] == 1.6
    # The router and the raylet (too small to list, still counted); the load is its own line.
    assert split["others_cores"] == 0.204
    assert split["cores"] == {REPLICA_TITLE: 1.6, "ray::router": 0.2, LOAD: 0.1}
    assert split["engine"]["graph_ms_per_step"] == 90.0
    assert (
        medians([split, {**split, "tokens_per_s": 100.0}, {**split, "tokens_per_s": 90.0}])[
            "tokens_per_s"
        ]
        == 100.0
    )
