"""Topology and EdgeConfig validation: messages name the bad field; the shipped colos are sane."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from edge_sim.config import EdgeConfig
from edge_sim.geo import haversine_km
from edge_sim.topology import Colo, Topology, UnknownColoError
from edge_sim.validation import EdgeConfigError


def colo(colo_id: str = "AMS", **overrides: object) -> dict[str, object]:
    base: dict[str, object] = {"id": colo_id, "city": "X", "country": "NL", "lat": 52.3, "lon": 4.8}
    return {**base, **overrides}


def topology_error(colos: list[dict[str, object]]) -> str:
    with pytest.raises(EdgeConfigError) as caught:
        Topology.from_mapping({"colos": colos})
    return str(caught.value)


@pytest.mark.parametrize(
    ("bad", "line"),
    [
        ({"lat": 91}, "colos[3].lat: must be between -90 and 90, got 91"),
        ({"lon": -181}, "colos[3].lon: must be between -180 and 180, got -181"),
        ({"id": "ams"}, "colos[3].id: must be 3 upper-case letters, got 'ams'"),
        ({"id": "AMSX"}, "colos[3].id: must be 3 upper-case letters"),
        ({"country": "NLD"}, "colos[3].country: must be an ISO-3166 alpha-2 code"),
        ({"status": "broken"}, "colos[3].status: "),
        ({"models": []}, "colos[3].models: must be '*' or a non-empty list"),
        ({"colour": "red"}, "colos[3].colour: unknown field"),
    ],
)
def test_bad_colo_field_is_named_with_its_position(bad, line):
    colos = [colo("AAA"), colo("BBB"), colo("CCC"), colo("DDD", **bad)]
    assert line in topology_error(colos)


def test_missing_field_is_named():
    broken = colo("DDD")
    del broken["lat"]
    assert "colos[0].lat: Field required" in topology_error([broken])


def test_duplicate_ids_are_rejected_naming_both_positions():
    message = topology_error([colo("AMS"), colo("FRA"), colo("AMS")])
    assert "colos[2].id: duplicate colo id 'AMS' (first at colos[0])" in message


def test_every_problem_is_listed():
    message = topology_error([colo("AAA", lat=100), colo("BBB", lon=200)])
    assert "colos[0].lat" in message and "colos[1].lon" in message


def test_colo_serves_star_or_listed_models():
    assert Colo.model_validate(colo(models="*")).serves("anything")
    listed = Colo.model_validate(colo(models=["glm", "kimi"]))
    assert listed.serves("kimi") and not listed.serves("minilm")


def test_topology_lookup_unknown_colo():
    topology = Topology.from_mapping({"colos": [colo("AMS")]})
    assert topology.colo("AMS").id == "AMS"
    with pytest.raises(UnknownColoError):
        topology.colo("XXX")


def test_shipped_topology_spans_every_inhabited_continent():
    topology = Topology.default()
    assert len(topology.colos) >= 16
    ids = set(topology.ids)
    assert {"AMS", "FRA", "LHR", "IAD", "ORD", "SJC", "GRU", "SCL"} <= ids
    assert {"NRT", "SIN", "HKG", "BOM", "SYD", "JNB", "LOS", "DXB"} <= ids

    def continent(lat: float, lon: float) -> str:
        # Coarse boxes are enough to tell which continent an airport is on.
        if lat < -10 and lon > 110:
            return "oceania"
        if lon < -30:
            return "north_america" if lat > 12 else "south_america"
        if lat < 36 and -20 < lon < 52 and not (lat > 29 and lon > 33):
            return "africa"
        if lon < 40 and lat > 36:
            return "europe"
        return "asia"

    assert {continent(c.lat, c.lon) for c in topology.colos} == {
        "europe",
        "asia",
        "africa",
        "north_america",
        "south_america",
        "oceania",
    }


def test_shipped_coordinates_are_the_named_cities():
    # Known city centres; the shipped points are airports (Narita is ~65 km out), so within 80 km.
    cities = {
        "LHR": (51.5074, -0.1278),
        "NRT": (35.6762, 139.6503),
        "SYD": (-33.8688, 151.2093),
        "GRU": (-23.5505, -46.6333),
        "JNB": (-26.2041, 28.0473),
        "SJC": (37.3382, -121.8863),
    }
    topology = Topology.default()
    for colo_id, (lat, lon) in cities.items():
        shipped = topology.colo(colo_id)
        assert haversine_km(shipped.lat, shipped.lon, lat, lon) < 80, colo_id


def test_edge_config_defaults_use_the_shipped_topology():
    config = EdgeConfig()
    assert config.resolved_topology.ids == Topology.default().ids
    assert config.latency.fiber_km_per_s == 200_000
    assert config.routing.max_extra_rtt_ms is None


def test_edge_config_inline_colos_error_path():
    with pytest.raises(EdgeConfigError) as caught:
        EdgeConfig.from_mapping({"topology": {"colos": [colo("AAA"), colo("BBB", lat=-95)]}})
    assert "topology.colos[1].lat: must be between -90 and 90, got -95" in str(caught.value)


def test_edge_config_inline_duplicates_rejected():
    with pytest.raises(EdgeConfigError, match=r"duplicate colo ids \['AAA'\]"):
        EdgeConfig.from_mapping({"topology": {"colos": [colo("AAA"), colo("AAA")]}})


@pytest.mark.parametrize(
    ("data", "line"),
    [
        ({"latency": {"fiber_km_per_s": 0}}, "latency.fiber_km_per_s: "),
        ({"latency": {"jiter_ms": 3}}, "latency.jiter_ms: unknown field"),
        (
            {"region_policy": {"health": {"base_ejection_s": 60, "max_ejection_s": 10}}},
            "max_ejection_s must be >=",
        ),
        (
            {"region_policy": {"health": {"max_ejection_percent": 150}}},
            "region_policy.health.max_ejection_percent: ",
        ),
        ({"health": {"consecutive_failures": 2}}, "health: unknown field"),
        ({"routing": {"max_candidates": 0}}, "routing.max_candidates: "),
        ({"faults": {"ZZZ": [{"down": True}]}}, "faults: unknown colo ids ['ZZZ']"),
        ({"faults": {"AMS": [{"error_rate": 1.5}]}}, "faults.AMS[0].error_rate: "),
        ({"faults": {"AMS": [{}]}}, "a fault must set down, added_latency_ms or error_rate"),
        ({"default_location": {"lat": 100}}, "default_location.lat: must be between -90 and 90"),
        ({"geoip_db": "/nonexistent/city.mmdb"}, "geoip_db: no such file"),
        ({"topology": {"path": "x.yaml", "colos": [colo()]}}, "set either path or colos"),
        ({"routers": {}}, "routers: unknown field"),
    ],
)
def test_edge_config_messages_name_the_field(data, line):
    with pytest.raises(EdgeConfigError) as caught:
        EdgeConfig.from_mapping(data)
    assert line in str(caught.value)


def test_from_yaml_resolves_paths_relative_to_the_file(tmp_path: Path):
    (tmp_path / "colos.yaml").write_text(
        yaml.safe_dump({"colos": [colo("AMS"), colo("FRA", lat=50.0, lon=8.6)]})
    )
    (tmp_path / "edge.yaml").write_text(
        yaml.safe_dump(
            {
                "topology": {"path": "colos.yaml"},
                "faults": {"FRA": [{"down": True, "start_after_s": 5, "duration_s": 10}]},
                "seed": 7,
            }
        )
    )
    config = EdgeConfig.from_yaml(tmp_path / "edge.yaml")
    assert config.resolved_topology.ids == ["AMS", "FRA"]
    assert config.faults["FRA"][0].duration_s == 10
    assert config.seed == 7


def test_from_yaml_reports_errors_inside_the_topology_file(tmp_path: Path):
    (tmp_path / "colos.yaml").write_text(yaml.safe_dump({"colos": [colo("AMS", lat=123)]}))
    (tmp_path / "edge.yaml").write_text(yaml.safe_dump({"topology": {"path": "colos.yaml"}}))
    with pytest.raises(EdgeConfigError) as caught:
        EdgeConfig.from_yaml(tmp_path / "edge.yaml")
    assert "colos[0].lat: must be between -90 and 90, got 123" in str(caught.value)


def test_from_yaml_missing_and_malformed_files(tmp_path: Path):
    with pytest.raises(EdgeConfigError, match="not found"):
        EdgeConfig.from_yaml(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("topology: [unclosed")
    with pytest.raises(EdgeConfigError, match="not valid YAML"):
        EdgeConfig.from_yaml(tmp_path / "bad.yaml")
    (tmp_path / "topology.yaml").write_text(yaml.safe_dump({"topology": {"path": "nope.yaml"}}))
    with pytest.raises(EdgeConfigError, match="topology file not found"):
        EdgeConfig.from_yaml(tmp_path / "topology.yaml")


def test_model_validate_is_usable_as_a_config_section():
    section = {"routing": {"max_candidates": 2}, "latency": {"real_delay_scale": 0}}
    config = EdgeConfig.model_validate(section)
    assert config.routing.max_candidates == 2
    assert config.latency.real_delay_s(100.0) == 0.0
