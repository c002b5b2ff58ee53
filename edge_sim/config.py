"""The `edge` section of the serving config: topology, latency, routing, regions, pre-warming,
faults, GeoIP."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from edge_sim.faults import ColoFault
from edge_sim.geo import ClientLocation
from edge_sim.latency import LatencyModel
from edge_sim.prewarm import PrewarmConfig
from edge_sim.regions import Region, RegionMap, RegionPolicy, validate_regions
from edge_sim.routing import RoutingConfig
from edge_sim.topology import Colo, Topology
from edge_sim.validation import (
    EdgeConfigError,
    Latitude,
    Longitude,
    describe,
    load_yaml_mapping,
)


def _base_dir(info: ValidationInfo) -> Path:
    """Relative paths are relative to the config file's folder (context), else to the cwd."""
    context = info.context if isinstance(info.context, Mapping) else {}
    return Path(context.get("base_dir", "."))


class TopologyConfig(BaseModel):
    """Colos inline, or a YAML file of colos; neither means the shipped default topology."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path | None = None
    colos: list[Colo] | None = Field(default=None, min_length=1)
    _resolved: Topology = PrivateAttr()

    @model_validator(mode="after")
    def _resolve(self, info: ValidationInfo) -> TopologyConfig:
        if self.path is not None and self.colos is not None:
            raise ValueError("set either path or colos, not both")
        if self.colos is not None:
            counts = Counter(colo.id for colo in self.colos)
            duplicates = sorted(colo_id for colo_id, n in counts.items() if n > 1)
            if duplicates:
                raise ValueError(f"colos: duplicate colo ids {duplicates}")
            self._resolved = Topology.model_construct(colos=list(self.colos))
        elif self.path is not None:
            path = self.path if self.path.is_absolute() else _base_dir(info) / self.path
            self._resolved = Topology.from_yaml(path)
        else:
            self._resolved = Topology.default()
        return self

    @property
    def resolved(self) -> Topology:
        return self._resolved


class ClientPoint(BaseModel):
    """Where to assume a client is when neither headers nor GeoIP say (default: Frankfurt)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lat: Latitude = 50.1109
    lon: Longitude = 8.6821
    country: str | None = "DE"

    def location(self) -> ClientLocation:
        return ClientLocation(self.lat, self.lon, "default", self.country)


class EdgeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    topology: TopologyConfig = Field(default_factory=TopologyConfig)
    latency: LatencyModel = Field(default_factory=LatencyModel)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    regions: dict[str, Region] | None = Field(
        default=None,
        description="GPU datacentres, one replica pool per model each; None: one pool per model",
    )
    region_policy: RegionPolicy = Field(default_factory=RegionPolicy)
    prewarm: PrewarmConfig = Field(
        default_factory=PrewarmConfig, description="predictive pre-warming by edge-control"
    )
    faults: dict[str, list[ColoFault]] = Field(
        default_factory=dict, description="colo id -> faults set when the network starts"
    )
    default_location: ClientPoint = Field(default_factory=ClientPoint)
    geoip_db: Path | None = Field(default=None, description="a MaxMind-format .mmdb file")
    seed: int = Field(default=0, description="seeds jitter and injected-failure draws")

    @field_validator("geoip_db")
    @classmethod
    def _geoip_exists(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is None:
            return None
        path = value if value.is_absolute() else _base_dir(info) / value
        if not path.is_file():
            raise ValueError(f"no such file: {path}")
        return path

    @model_validator(mode="after")
    def _faults_name_known_colos(self) -> EdgeConfig:
        known = set(self.topology.resolved.ids)
        unknown = sorted(set(self.faults) - known)
        if unknown:
            raise ValueError(f"faults: unknown colo ids {unknown}; known: {sorted(known)}")
        return self

    @model_validator(mode="after")
    def _regions_cover_known_colos(self) -> EdgeConfig:
        if self.regions is not None:
            validate_regions(self.regions, self.topology.resolved)
        return self

    @property
    def resolved_topology(self) -> Topology:
        return self.topology.resolved

    @property
    def region_names(self) -> tuple[str, ...]:
        return self.region_map().names

    def region_map(self) -> RegionMap:
        return RegionMap(
            self.topology.resolved, self.regions, self.latency, self.region_policy.backhaul
        )

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, base_dir: Path | None = None) -> EdgeConfig:
        """Validate, raising EdgeConfigError with one `path: problem` line per problem."""
        context = {"base_dir": base_dir} if base_dir is not None else None
        try:
            return cls.model_validate(data, context=context)
        except ValidationError as error:
            raise EdgeConfigError(f"invalid edge config:\n{describe(error)}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> EdgeConfig:
        path = Path(path)
        data = load_yaml_mapping(path, "edge config", empty_ok=True)
        return cls.from_mapping(data, base_dir=path.parent)
