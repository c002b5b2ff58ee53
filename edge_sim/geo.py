"""Great-circle distance and where a client is: from headers, a GeoIP database, or a default.

Pure functions plus one `ClientLocator` that holds the lookup tables; nothing here does I/O per
request (the GeoIP database is memory-mapped once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

EARTH_RADIUS_KM = 6371.0088  # IUGG mean radius
GEO_HEADER = "x-client-geo"
COUNTRY_HEADER = "cf-ipcountry"
# Cloudflare's documented non-country values of CF-IPCountry: unknown origin, and Tor.
NO_COUNTRY_VALUES = frozenset({"XX", "T1"})

LocationSource = Literal["header", "country", "ip", "default"]


class BadHeaderError(ValueError):
    """A location header the client sent is malformed; the router answers 400 naming `header`."""

    def __init__(self, header: str, message: str):
        super().__init__(f"invalid {header} header: {message}")
        self.header = header
        self.message = message


@dataclass(frozen=True, slots=True)
class ClientLocation:
    lat: float
    lon: float
    source: LocationSource
    country: str | None = None


def haversine_km(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance between two points given in degrees, in km."""
    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    half_dphi = (phi2 - phi1) / 2
    half_dlambda = math.radians(lon2 - lon1) / 2
    a = math.sin(half_dphi) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(half_dlambda) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(a)))


def parse_geo_header(value: str) -> tuple[float, float]:
    """`"<lat>,<lon>"` in decimal degrees -> (lat, lon); BadHeaderError names the header."""
    parts = value.split(",")
    if len(parts) != 2:
        raise BadHeaderError(GEO_HEADER, f"expected '<lat>,<lon>', got {value!r}")
    try:
        lat, lon = float(parts[0]), float(parts[1])
    except ValueError:
        raise BadHeaderError(
            GEO_HEADER, f"expected two numbers '<lat>,<lon>', got {value!r}"
        ) from None
    # NaN fails both comparisons, so it is rejected here too.
    if not -90.0 <= lat <= 90.0:
        raise BadHeaderError(
            GEO_HEADER, f"latitude must be between -90 and 90, got {parts[0].strip()}"
        )
    if not -180.0 <= lon <= 180.0:
        raise BadHeaderError(
            GEO_HEADER, f"longitude must be between -180 and 180, got {parts[1].strip()}"
        )
    return lat, lon


class CountryCentroids:
    """ISO-3166 alpha-2 code -> (lat, lon) of the country's centre."""

    def __init__(self, coordinates: Mapping[str, tuple[float, float]]):
        self._coordinates = {code.upper(): latlon for code, latlon in coordinates.items()}

    def __len__(self) -> int:
        return len(self._coordinates)

    def get(self, code: str) -> tuple[float, float] | None:
        return self._coordinates.get(code)

    @classmethod
    def from_countryinfo(cls) -> CountryCentroids:
        """Every country the `countryinfo` package knows (~250); loads in about 60 ms."""
        from countryinfo import CountryInfo  # lazy: only the network facade needs the table

        codes = sorted(
            {
                info["ISO"]["alpha2"]
                for info in CountryInfo.all().values()
                if info.get("ISO", {}).get("alpha2")
            }
        )
        coordinates: dict[str, tuple[float, float]] = {}
        for code in codes:
            # Resolving by code picks the sovereign entry when a code appears twice (GB, Wales).
            info: Mapping[str, Any] = CountryInfo(code).info()
            # A handful of territories lack a centre but have their capital's position.
            latlng = info.get("latlng") or info.get("capital_latlng")
            if isinstance(latlng, list) and len(latlng) == 2:
                coordinates[code] = (float(latlng[0]), float(latlng[1]))
        return cls(coordinates)


class GeoIPReader(Protocol):
    """What `maxminddb.Reader` offers that we use: a record (GeoLite2 layout) or None."""

    def get(self, ip_address: str) -> Any: ...


def open_geoip(path: str | Path) -> GeoIPReader:
    """Open a MaxMind-format (.mmdb) database, memory-mapped."""
    import maxminddb  # lazy: only deployments that configure a database need the package

    return maxminddb.open_database(str(path))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None and isinstance(headers, dict):
        # Starlette's Headers are case-insensitive already; a plain dict may not be lower-case.
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


class ClientLocator:
    """Where a request comes from, in this order: x-client-geo, cf-ipcountry, GeoIP, default."""

    def __init__(
        self,
        default: ClientLocation,
        centroids: CountryCentroids,
        geoip: GeoIPReader | None = None,
    ):
        self._default = default
        self._centroids = centroids
        self._geoip = geoip

    def locate(self, headers: Mapping[str, str], client_ip: str | None = None) -> ClientLocation:
        geo = _header(headers, GEO_HEADER)
        if geo is not None:
            lat, lon = parse_geo_header(geo)
            return ClientLocation(lat, lon, "header")
        country = _header(headers, COUNTRY_HEADER)
        if country is not None:
            located = self._from_country_header(country)
            if located is not None:
                return located
        if client_ip and self._geoip is not None:
            located = self._from_ip(self._geoip, client_ip)
            if located is not None:
                return located
        return self._default

    def _from_country_header(self, value: str) -> ClientLocation | None:
        code = value.strip().upper()
        if code in NO_COUNTRY_VALUES:
            return None
        centre = self._centroids.get(code) if len(code) == 2 and code.isalpha() else None
        if centre is None:
            raise BadHeaderError(
                COUNTRY_HEADER, f"unknown ISO-3166 alpha-2 country code {value.strip()!r}"
            )
        return ClientLocation(centre[0], centre[1], "country", code)

    def _from_ip(self, geoip: GeoIPReader, client_ip: str) -> ClientLocation | None:
        try:
            record = geoip.get(client_ip)
        except ValueError:
            # Not an IP address (e.g. a test client's host name), or IPv6 in an IPv4 database.
            return None
        if not isinstance(record, Mapping):
            return None
        country_record = record.get("country")
        country = country_record.get("iso_code") if isinstance(country_record, Mapping) else None
        location = record.get("location")
        if isinstance(location, Mapping):
            lat, lon = location.get("latitude"), location.get("longitude")
            if isinstance(lat, int | float) and isinstance(lon, int | float):
                return ClientLocation(float(lat), float(lon), "ip", country)
        # A country-level database (GeoLite2-Country) has no coordinates: use the centre.
        centre = self._centroids.get(country) if isinstance(country, str) else None
        if centre is not None:
            return ClientLocation(centre[0], centre[1], "ip", country)
        return None
