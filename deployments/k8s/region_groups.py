"""Regions on Kubernetes: one GPU worker group per region, whose nodes carry the region's
`region:<name>` resource (replicas of `<model>-<region>` ask for a sliver of it), all scaling to
zero; the CPU group carries the ingress resource that pins the router and edge-control there."""

from __future__ import annotations

import copy
import json
from typing import Any

from deployments.config import parse_app_config
from edge_sim.regions import region_resource

# The template's GPU group is the prototype of every region's group (`gpu-eu`, ...); its CPU
# group runs the router and edge-control.
REGION_GROUP_PROTOTYPE = "gpu"
INGRESS_GROUP = "cpu"
INGRESS_RESOURCE = "ingress"
# A node's amount of its custom resource: replicas ask for a tiny share, so any number fits.
NODE_RESOURCE_AMOUNT = 100


def regions_of(serve_config: dict[str, Any]) -> list[str]:
    """Every region any application declares, in order."""
    regions: list[str] = []
    for app in serve_config["applications"]:
        for region in parse_app_config(app["args"]).edge.regions or {}:
            if region not in regions:
                regions.append(region)
    return regions


def pin_to_region_groups(app_args: dict[str, Any]) -> None:
    """The serve config's side: replicas need their region's node resource (the GPU groups may
    be at zero when the app is built, so `auto` would find none), the ingress its own."""
    if app_args.get("edge", {}).get("regions"):
        policy = app_args["edge"].setdefault("region_policy", {})
        policy["placement"] = "node_resource"
        policy["ingress_resource"] = INGRESS_RESOURCE


def ray_start_resources(resources: dict[str, float]) -> str:
    """KubeRay's rayStartParams form of `ray start --resources`: a quoted JSON string."""
    return '"' + json.dumps(resources).replace('"', '\\"') + '"'


def split_region_groups(cluster: dict[str, Any], regions: list[str]) -> None:
    """Replace the template's GPU group by one copy per region, and mark the CPU group."""
    groups = cluster["workerGroupSpecs"]
    names = [group["groupName"] for group in groups]
    if REGION_GROUP_PROTOTYPE not in names or INGRESS_GROUP not in names:
        raise ValueError(
            f"the template needs worker groups {REGION_GROUP_PROTOTYPE!r} and {INGRESS_GROUP!r}"
        )
    prototype = groups[names.index(REGION_GROUP_PROTOTYPE)]
    per_region = []
    for region in regions:
        group = copy.deepcopy(prototype)
        group["groupName"] = f"{REGION_GROUP_PROTOTYPE}-{region}"
        group["replicas"] = 0
        group["minReplicas"] = 0
        group["rayStartParams"]["resources"] = ray_start_resources(
            {region_resource(region): NODE_RESOURCE_AMOUNT}
        )
        per_region.append(group)
    ingress = groups[names.index(INGRESS_GROUP)]
    ingress["rayStartParams"]["resources"] = ray_start_resources(
        {INGRESS_RESOURCE: NODE_RESOURCE_AMOUNT}
    )
    at = names.index(REGION_GROUP_PROTOTYPE)
    cluster["workerGroupSpecs"] = [*groups[:at], *per_region, *groups[at + 1 :]]
