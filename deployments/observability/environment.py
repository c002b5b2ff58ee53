"""The environment variables that override the tracing config: the OpenTelemetry SDK's standard
ones (OTEL_*), then EDGE_TRACES_FILE. Read where `serve run` builds the app (the resolved config
reaches replicas on every node) and again in each process. A bad value is a ValueError naming
the variable, so `serve run` stops with it instead of every replica logging it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args
from urllib.parse import unquote

from pydantic import ValidationError

from deployments.observability.config import SamplerName, TracingConfig

EDGE_TRACES_FILE_ENV = "EDGE_TRACES_FILE"
OTEL_SDK_DISABLED = "OTEL_SDK_DISABLED"
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_EXPORTER_OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
OTEL_RESOURCE_ATTRIBUTES = "OTEL_RESOURCE_ATTRIBUTES"
OTEL_TRACES_SAMPLER = "OTEL_TRACES_SAMPLER"
OTEL_TRACES_SAMPLER_ARG = "OTEL_TRACES_SAMPLER_ARG"

# OTLP's protocol names -> our exporter modules. http/json has no Python exporter.
_PROTOCOLS = {"http/protobuf": "http", "grpc": "grpc"}
_EXPORTERS = ("otlp", "console", "none")
_SAMPLERS: tuple[str, ...] = get_args(SamplerName)
OTLP_TRACES_PATH = "/v1/traces"


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _exporter(environ: Mapping[str, str], has_endpoint: bool) -> str | None:
    if (_get(environ, OTEL_SDK_DISABLED) or "").lower() == "true":
        return "none"
    named = _get(environ, OTEL_TRACES_EXPORTER)
    if named is None:
        # The SDK's default exporter is otlp: an endpoint alone is asking for it.
        return "otlp" if has_endpoint else None
    first = named.split(",")[0].strip().lower()
    if first not in _EXPORTERS:
        raise ValueError(f"{OTEL_TRACES_EXPORTER}={named!r}: use one of {', '.join(_EXPORTERS)}")
    return first


def _protocol(environ: Mapping[str, str]) -> str | None:
    for name in (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL):
        value = _get(environ, name)
        if value is not None:
            if value not in _PROTOCOLS:
                raise ValueError(f"{name}={value!r}: use one of {', '.join(_PROTOCOLS)}")
            return _PROTOCOLS[value]
    return None


def _endpoint(environ: Mapping[str, str], protocol: str) -> str | None:
    """The signal-specific endpoint is used as is; the base one gets /v1/traces over HTTP, as
    the OTLP exporter specification says (gRPC takes the base as is)."""
    traces = _get(environ, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
    if traces is not None:
        return traces
    base = _get(environ, OTEL_EXPORTER_OTLP_ENDPOINT)
    if base is None or protocol == "grpc":
        return base
    return base.rstrip("/") + OTLP_TRACES_PATH


def parse_resource_attributes(value: str) -> dict[str, str]:
    """`key1=value1,key2=value2` with percent-encoded values, as the SDK reads it."""
    attributes = {}
    for item in value.split(","):
        if not item.strip():
            continue
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{OTEL_RESOURCE_ATTRIBUTES}: {item!r} is not key=value")
        attributes[key.strip()] = unquote(raw.strip())
    return attributes


def _sampler(environ: Mapping[str, str]) -> dict[str, Any]:
    update: dict[str, Any] = {}
    name = _get(environ, OTEL_TRACES_SAMPLER)
    if name is not None:
        if name not in _SAMPLERS:
            raise ValueError(f"{OTEL_TRACES_SAMPLER}={name!r}: use one of {', '.join(_SAMPLERS)}")
        update["sampler"] = name
    arg = _get(environ, OTEL_TRACES_SAMPLER_ARG)
    if arg is not None:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"{OTEL_TRACES_SAMPLER_ARG}={arg!r}: a ratio from 0 to 1")
        update["sample_ratio"] = ratio
    return update


def otel_overrides(config: TracingConfig, environ: Mapping[str, str]) -> dict[str, Any]:
    """The TracingConfig fields the OTEL_* variables set (the config file's value otherwise)."""
    update: dict[str, Any] = {}
    protocol = _protocol(environ)
    if protocol is not None:
        update["otlp_protocol"] = protocol
    endpoint = _endpoint(environ, protocol or config.otlp_protocol)
    if endpoint is not None:
        update["otlp_endpoint"] = endpoint
    exporter = _exporter(environ, endpoint is not None)
    if exporter is not None:
        update["exporter"] = exporter
    resource = _get(environ, OTEL_RESOURCE_ATTRIBUTES)
    attributes = dict(config.resource_attributes)
    if resource is not None:
        attributes.update(parse_resource_attributes(resource))
        update["resource_attributes"] = attributes
    service = _get(environ, OTEL_SERVICE_NAME) or (
        attributes.get("service.name") if resource is not None else None
    )
    if service is not None:
        update["service_name"] = service
    update.update(_sampler(environ))
    return update


def resolve_tracing_config(config: TracingConfig, environ: Mapping[str, str]) -> TracingConfig:
    """`config` with the environment applied: OTEL_* over the file, then EDGE_TRACES_FILE over
    both (its path made absolute, because Ray workers do not start in the caller's directory).
    Returns `config` itself when nothing is set."""
    update = otel_overrides(config, environ)
    path = _get(environ, EDGE_TRACES_FILE_ENV)
    if path is not None:
        update.update(exporter="jsonl", path=str(Path(path).resolve()))
    if not update:
        return config
    try:
        # Validated again: an otlp exporter needs its endpoint and package either way.
        return TracingConfig.model_validate({**config.model_dump(), **update})
    except ValidationError as exc:
        problems = "; ".join(str(error["msg"]) for error in exc.errors())
        raise ValueError(f"tracing settings from the environment: {problems}") from None
