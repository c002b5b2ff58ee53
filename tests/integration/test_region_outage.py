"""A region outage for real: a 3-node Ray cluster on this machine (the head carries region eu and
the ingress, one node each for us and ap), load from mixed cities, then the ap node's processes
killed at once. No non-streaming request may fail; ap's traffic moves to the next region; with
the node back, Serve places ap's replica again and the traffic returns."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from region_app import (
    CITY_PROBES,
    CLUSTER_ENV,
    MixedLoad,
    RegionApp,
    free_port,
    region_config,
    running_app,
    wait_until,
)

from edgectl.local_cluster import LocalCluster

INGRESS = "ingress"
NODE_CPUS = 1
RETURN_S = 240  # node start + replica start on a loaded 2-core machine


@pytest.fixture(scope="module")
def cluster(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    ray = LocalCluster.start(
        num_cpus=2, resources={"region:eu": 100, INGRESS: 100}, env=CLUSTER_ENV
    )
    try:
        for region in ("us", "ap"):
            ray.add_node(region, num_cpus=NODE_CPUS, resources={f"region:{region}": 100})
        yield ray
    finally:
        ray.stop()


@pytest.fixture(scope="module")
def app(cluster: LocalCluster, models_root: Path, tmp_path_factory) -> Iterator[RegionApp]:
    config = region_config(
        models_root,
        free_port(),
        {"embedding": {"eu": 1, "us": 1, "ap": 1}},
        ingress_resource=INGRESS,
    )
    yield from running_app(cluster, tmp_path_factory.mktemp("outage"), config)


def test_killing_a_regions_node_fails_no_request_and_its_traffic_comes_back(
    cluster, app, record_property
):
    # Right after the deploy a router may not have seen us or ap warm yet, and would send their
    # cities' first requests to a warm region (route reason "warm"): not what is tested here.
    wait_until(app.every_city_served_from_its_region, 60, "every city served from its region")
    load = MixedLoad.everywhere(app.base_url)
    load.start()
    try:
        started = time.monotonic()
        wait_until(
            lambda: len([a for a in load.from_city("tokyo", started) if a.region == "ap"]) >= 5,
            60,
            "Tokyo served from ap",
        )
        (ap_node,) = [node for node in cluster.nodes if node.name == "ap"]
        killed_at = time.monotonic()
        cluster.kill_node(ap_node)

        # ap's clients move to another region once Ray declares the node dead (a few seconds;
        # replicas already serving may finish what they hold).
        def tokyo_moved() -> bool:
            served = [a.region for a in load.from_city("tokyo", killed_at) if a.status == 200]
            return len(served) >= 5 and set(served[-5:]) <= {"eu", "us"}

        wait_until(tokyo_moved, 120, "Tokyo served elsewhere")
        moved_at = time.monotonic()
        time.sleep(5)  # a few more answers while ap is down
        restarted_at = time.monotonic()
        cluster.restart_node(ap_node)
        node_up_at = time.monotonic()
        wait_until(
            lambda: any(a.region == "ap" for a in load.from_city("tokyo", restarted_at)),
            RETURN_S,
            "Tokyo served from ap again",
        )
        # How long healing took, in the test report (junit XML): the node's start, then Serve
        # placing ap's replica and the routers seeing it warm.
        record_property("node_start_s", round(node_up_at - restarted_at, 1))
        record_property("served_again_s", round(time.monotonic() - node_up_at, 1))
    finally:
        load.stop()
    failed = [a for a in load.answers if a.status != 200]
    assert not failed, failed[:5]
    during = [a for a in load.from_city("tokyo", moved_at) if a.sent_at < restarted_at]
    assert during and {a.region for a in during} <= {"eu", "us"}
    # The other regions' clients never noticed.
    for city in ("frankfurt", "new_york"):
        assert {a.region for a in load.from_city(city, started)} == {CITY_PROBES[city][1]}
