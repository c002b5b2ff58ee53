"""The world outline for the dashboard's map: the country shapes `countryinfo` ships, as SVG
paths in an equirectangular projection (x = longitude, y = -latitude), rounded to 0.1 degree."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any

VIEW_BOX = "-172 -84 368 150"  # 84N to 66S: the inhabited world, room for labels
Ring = Sequence[Sequence[float]]


def _rings(geometry: dict[str, Any]) -> Iterator[Ring]:
    if geometry["type"] == "Polygon":
        yield from geometry["coordinates"]
    elif geometry["type"] == "MultiPolygon":
        for polygon in geometry["coordinates"]:
            yield from polygon


def ring_path(ring: Ring) -> str:
    """One closed SVG subpath; points that round to the previous one are dropped."""
    points: list[str] = []
    for lon, lat, *_ in ring:
        point = f"{round(lon, 1):g},{round(-lat, 1):g}"
        if not points or points[-1] != point:
            points.append(point)
    return "M" + "L".join(points) + "Z" if len(points) >= 3 else ""


@functools.lru_cache(maxsize=1)
def world_outline() -> dict[str, Any]:
    """{"view_box", "countries": [{"id": ISO alpha-3, "name", "d": SVG path}]}, made once."""
    from countryinfo import CountryInfo  # ~0.2 s to load: only when the page asks

    countries = []
    for info in CountryInfo.all().values():
        for feature in (info.get("geoJSON") or {}).get("features", []):
            path = "".join(ring_path(ring) for ring in _rings(feature["geometry"]))
            if path:
                name = feature.get("properties", {}).get("name", "")
                countries.append({"id": feature.get("id", ""), "name": name, "d": path})
    countries.sort(key=lambda country: country["id"])
    return {"view_box": VIEW_BOX, "countries": countries}
