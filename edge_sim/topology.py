"""The edge network's colos (points of presence), validated from YAML or inline config."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from edge_sim.validation import (
    EdgeConfigError,
    Latitude,
    Longitude,
    describe,
    load_yaml_mapping,
)

ColoStatus = Literal["active", "maintenance"]
ALL_MODELS: Literal["*"] = "*"


class UnknownColoError(LookupError):
    """A colo id that the topology does not contain (admin API maps it to 404)."""

    def __init__(self, colo_id: str):
        super().__init__(f"unknown colo {colo_id!r}")
        self.colo_id = colo_id


class Colo(BaseModel):
    """One point of presence (simulated): where it is and which models it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="IATA-style code, 3 upper-case letters")
    city: str = Field(min_length=1)
    country: str = Field(description="ISO-3166 alpha-2 code")
    lat: Latitude
    lon: Longitude
    models: list[str] | Literal["*"] = ALL_MODELS
    status: ColoStatus = "active"

    @field_validator("id")
    @classmethod
    def _iata_style(cls, value: str) -> str:
        if len(value) != 3 or not value.isascii() or not value.isalpha() or not value.isupper():
            raise PydanticCustomError("colo_id", f"must be 3 upper-case letters, got {value!r}")
        return value

    @field_validator("country")
    @classmethod
    def _alpha2(cls, value: str) -> str:
        if len(value) != 2 or not value.isascii() or not value.isalpha() or not value.isupper():
            raise PydanticCustomError(
                "country", f"must be an ISO-3166 alpha-2 code like 'DE', got {value!r}"
            )
        return value

    @field_validator("models")
    @classmethod
    def _models_named(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, list) and (not value or any(not name for name in value)):
            raise PydanticCustomError("models", "must be '*' or a non-empty list of model names")
        return value

    def serves(self, model: str) -> bool:
        return self.models == ALL_MODELS or model in self.models


class Topology(BaseModel):
    """All colos of the network; ids are unique and order is kept (it breaks RTT ties)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    colos: list[Colo] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_ids(self) -> Topology:
        seen: dict[str, int] = {}
        for position, colo in enumerate(self.colos):
            if colo.id in seen:
                raise PydanticCustomError(
                    "duplicate_colo",
                    f"colos[{position}].id: duplicate colo id {colo.id!r} "
                    f"(first at colos[{seen[colo.id]}])",
                )
            seen[colo.id] = position
        return self

    @property
    def ids(self) -> list[str]:
        return [colo.id for colo in self.colos]

    def colo(self, colo_id: str) -> Colo:
        for colo in self.colos:
            if colo.id == colo_id:
                return colo
        raise UnknownColoError(colo_id)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "topology") -> Topology:
        try:
            return cls.model_validate(data)
        except ValidationError as error:
            raise EdgeConfigError(f"invalid {source}:\n{describe(error)}") from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> Topology:
        path = Path(path)
        return cls.from_mapping(load_yaml_mapping(path, "topology"), source=str(path))

    @classmethod
    def default(cls) -> Topology:
        """The shipped colos (edge_sim/data/colos.yaml)."""
        with resources.as_file(resources.files("edge_sim") / "data" / "colos.yaml") as path:
            return cls.from_yaml(path)
