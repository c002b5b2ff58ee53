"""Distances, and where a client is: x-client-geo, cf-ipcountry, GeoIP (a real .mmdb), default."""

from __future__ import annotations

import ipaddress
import math
import struct
from pathlib import Path
from typing import Any

import pytest

from edge_sim.geo import (
    EARTH_RADIUS_KM,
    BadHeaderError,
    ClientLocation,
    ClientLocator,
    CountryCentroids,
    haversine_km,
    open_geoip,
    parse_geo_header,
)

LONDON = (51.5074, -0.1278)
NEW_YORK = (40.7128, -74.0060)
SYDNEY = (-33.8688, 151.2093)
TOKYO = (35.6762, 139.6503)
PARIS = (48.8566, 2.3522)
BERLIN = (52.5200, 13.4050)
LOS_ANGELES = (34.0522, -118.2437)

DEFAULT = ClientLocation(50.11, 8.68, "default", "DE")
CENTROIDS = CountryCentroids({"GB": (54.0, -2.0), "JP": (36.0, 138.0), "cn": (35.0, 105.0)})


@pytest.mark.parametrize(
    ("a", "b", "published_km"),
    [
        (LONDON, NEW_YORK, 5570),
        (SYDNEY, TOKYO, 7820),
        (PARIS, BERLIN, 878),
        (LOS_ANGELES, NEW_YORK, 3936),
    ],
)
def test_haversine_matches_published_city_distances(a, b, published_km):
    assert haversine_km(*a, *b) == pytest.approx(published_km, rel=0.01)
    assert haversine_km(*b, *a) == pytest.approx(haversine_km(*a, *b))


def test_haversine_zero_and_antipodes():
    assert haversine_km(*PARIS, *PARIS) == 0.0
    assert haversine_km(10.0, 20.0, -10.0, -160.0) == pytest.approx(math.pi * EARTH_RADIUS_KM)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("51.5,-0.12", (51.5, -0.12)), (" -33.9 , 151.2 ", (-33.9, 151.2)), ("90,180", (90, 180))],
)
def test_geo_header_parses(value, expected):
    assert parse_geo_header(value) == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("51.5", "expected '<lat>,<lon>'"),
        ("1,2,3", "expected '<lat>,<lon>'"),
        ("north,west", "two numbers"),
        ("91,0", "latitude must be between -90 and 90"),
        ("-90.5,0", "latitude"),
        ("0,180.01", "longitude must be between -180 and 180"),
        ("nan,0", "latitude"),
        ("0,inf", "longitude"),
    ],
)
def test_bad_geo_header_names_the_header(value, says):
    locator = ClientLocator(DEFAULT, CENTROIDS)
    with pytest.raises(BadHeaderError) as caught:
        locator.locate({"x-client-geo": value})
    assert caught.value.header == "x-client-geo"
    assert says in caught.value.message
    assert "x-client-geo" in str(caught.value)


def test_geo_header_wins_over_country_and_ip():
    locator = ClientLocator(DEFAULT, CENTROIDS, geoip=_FakeReader({"1.2.3.4": _city(1, 2, "JP")}))
    located = locator.locate({"x-client-geo": "-33.9,151.2", "cf-ipcountry": "GB"}, "1.2.3.4")
    assert located == ClientLocation(-33.9, 151.2, "header", None)


def test_header_names_are_case_insensitive_for_plain_dicts():
    located = ClientLocator(DEFAULT, CENTROIDS).locate({"CF-IPCountry": "gb"})
    assert (located.source, located.country) == ("country", "GB")


def test_country_header_resolves_to_the_centroid():
    located = ClientLocator(DEFAULT, CENTROIDS).locate({"cf-ipcountry": "JP"})
    assert located == ClientLocation(36.0, 138.0, "country", "JP")


@pytest.mark.parametrize("value", ["ZZ", "G", "GBR", "1A", ""])
def test_unknown_country_code_is_a_bad_header(value):
    with pytest.raises(BadHeaderError) as caught:
        ClientLocator(DEFAULT, CENTROIDS).locate({"cf-ipcountry": value})
    assert caught.value.header == "cf-ipcountry"
    assert "country code" in caught.value.message


@pytest.mark.parametrize("value", ["XX", "T1"])
def test_cloudflare_no_country_values_fall_through(value):
    located = ClientLocator(DEFAULT, CENTROIDS).locate({"cf-ipcountry": value}, "9.9.9.9")
    assert located == DEFAULT


def test_no_information_gives_the_default():
    assert ClientLocator(DEFAULT, CENTROIDS).locate({}, "81.2.69.142") == DEFAULT


class _FakeReader:
    def __init__(self, records: dict[str, Any]):
        self.records = records

    def get(self, ip_address: str) -> Any:
        ipaddress.ip_address(ip_address)  # raises ValueError like maxminddb does
        return self.records.get(ip_address)


def _city(lat: float, lon: float, country: str) -> dict[str, Any]:
    return {"country": {"iso_code": country}, "location": {"latitude": lat, "longitude": lon}}


def test_injected_reader_country_only_record_uses_the_centroid():
    locator = ClientLocator(
        DEFAULT, CENTROIDS, geoip=_FakeReader({"5.5.5.5": {"country": {"iso_code": "JP"}}})
    )
    assert locator.locate({}, "5.5.5.5") == ClientLocation(36.0, 138.0, "ip", "JP")


# --- a real MaxMind DB, written here in the MMDB format (maxminddb only reads) ---------------


def _control(type_code: int, size: int) -> bytes:
    assert size < 29
    if type_code <= 7:
        return bytes([(type_code << 5) | size])
    return bytes([size, type_code - 7])  # extended type


def _uint(type_code: int, value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return _control(type_code, len(raw)) + raw


def _encode(value: Any) -> bytes:
    if isinstance(value, tuple):  # ("uint16" | "uint32" | "uint64", n)
        return _uint({"uint16": 5, "uint32": 6, "uint64": 9}[value[0]], value[1])
    if isinstance(value, dict):
        return _control(7, len(value)) + b"".join(
            _encode(key) + _encode(item) for key, item in value.items()
        )
    if isinstance(value, list):
        return _control(11, len(value)) + b"".join(_encode(item) for item in value)
    if isinstance(value, str):
        raw = value.encode()
        return _control(2, len(raw)) + raw
    if isinstance(value, float):
        return _control(3, 8) + struct.pack(">d", value)
    raise TypeError(value)


def write_mmdb(path: Path, networks: dict[str, dict[str, Any]]) -> None:
    """An IPv4 GeoIP2-City-shaped database with 24-bit records (disjoint networks only)."""
    data = b""
    nodes: list[list[Any]] = [[None, None]]
    for cidr, record in networks.items():
        network = ipaddress.ip_network(cidr)
        offset, data = len(data), data + _encode(record)
        address, node = int(network.network_address), 0
        for depth in range(network.prefixlen):
            bit = (address >> (31 - depth)) & 1
            if depth == network.prefixlen - 1:
                nodes[node][bit] = ("data", offset)
            else:
                if nodes[node][bit] is None:
                    nodes.append([None, None])
                    nodes[node][bit] = len(nodes) - 1
                node = nodes[node][bit]
    count = len(nodes)

    def record_value(record: Any) -> int:
        if record is None:
            return count  # "no data"
        if isinstance(record, tuple):
            return count + 16 + record[1]
        return record

    tree = b"".join(
        record_value(left).to_bytes(3, "big") + record_value(right).to_bytes(3, "big")
        for left, right in nodes
    )
    metadata = {
        "binary_format_major_version": ("uint16", 2),
        "binary_format_minor_version": ("uint16", 0),
        "build_epoch": ("uint64", 1_700_000_000),
        "database_type": "Test-City",
        "description": {"en": "edge_sim test database"},
        "ip_version": ("uint16", 4),
        "languages": ["en"],
        "node_count": ("uint32", count),
        "record_size": ("uint16", 24),
    }
    path.write_bytes(tree + bytes(16) + data + b"\xab\xcd\xefMaxMind.com" + _encode(metadata))


@pytest.fixture(scope="module")
def geoip_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("geoip") / "test-city.mmdb"
    write_mmdb(
        path,
        {
            "81.2.69.0/24": _city(51.5142, -0.0931, "GB"),
            "175.16.199.0/24": {"country": {"iso_code": "CN"}},
            "2.125.160.0/20": _city(-33.87, 151.21, "AU"),
        },
    )
    return path


def test_real_mmdb_city_record_gives_its_coordinates(geoip_db):
    locator = ClientLocator(DEFAULT, CENTROIDS, geoip=open_geoip(geoip_db))
    assert locator.locate({}, "81.2.69.142") == ClientLocation(51.5142, -0.0931, "ip", "GB")
    assert locator.locate({}, "2.125.175.1") == ClientLocation(-33.87, 151.21, "ip", "AU")


def test_real_mmdb_country_record_uses_the_centroid(geoip_db):
    locator = ClientLocator(DEFAULT, CENTROIDS, geoip=open_geoip(geoip_db))
    assert locator.locate({}, "175.16.199.7") == ClientLocation(35.0, 105.0, "ip", "CN")


@pytest.mark.parametrize("ip", ["10.0.0.1", "2.125.176.1", "testclient", "::1"])
def test_real_mmdb_misses_fall_back_to_the_default(geoip_db, ip):
    locator = ClientLocator(DEFAULT, CENTROIDS, geoip=open_geoip(geoip_db))
    assert locator.locate({}, ip) == DEFAULT


def test_country_header_wins_over_ip(geoip_db):
    locator = ClientLocator(DEFAULT, CENTROIDS, geoip=open_geoip(geoip_db))
    assert locator.locate({"cf-ipcountry": "JP"}, "81.2.69.142").source == "country"


def test_countryinfo_table_covers_the_world_with_plausible_centres():
    centroids = CountryCentroids.from_countryinfo()
    assert len(centroids) >= 240
    # Each centre lies inside the country's rough bounding box (lat_min, lat_max, lon_min, lon_max).
    boxes = {
        "GB": (49, 61, -9, 2),
        "JP": (24, 46, 122, 146),
        "AU": (-44, -10, 112, 154),
        "BR": (-34, 6, -74, -34),
        "US": (24, 50, -125, -66),
        "ZA": (-35, -22, 16, 33),
        "IN": (6, 36, 68, 98),
        "DE": (47, 55, 5, 16),
    }
    for code, (lat_min, lat_max, lon_min, lon_max) in boxes.items():
        lat, lon = centroids.get(code) or (math.nan, math.nan)
        assert lat_min <= lat <= lat_max and lon_min <= lon <= lon_max, code
