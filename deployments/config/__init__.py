"""Every setting of the application, declared once (pydantic, `extra="forbid"`, units in names):
`app` (the `args:` of serve_config.yaml, validated once at build time), the `router`'s and the
gateway's `security` and `state`, the warm pool's. A whole Serve config file, checked before
deploy or narrowed by the tools that deploy part of it: deployments.serve_file."""

from deployments.config.app import (
    APP_DEPLOYMENTS,
    MIB,
    PROJECT_ROOT,
    AppConfig,
    BatchingConfig,
    ConfigError,
    ModelConfig,
    describe_validation_error,
    parse_app_config,
    serve_switches,
)
from deployments.config.router import (
    CacheConfig,
    CoalesceConfig,
    FairQueueConfig,
    ListenerConfig,
    RouterConfig,
    SingleFlightConfig,
)

__all__ = [
    "APP_DEPLOYMENTS",
    "MIB",
    "PROJECT_ROOT",
    "AppConfig",
    "BatchingConfig",
    "CacheConfig",
    "CoalesceConfig",
    "ConfigError",
    "FairQueueConfig",
    "ListenerConfig",
    "ModelConfig",
    "RouterConfig",
    "SingleFlightConfig",
    "describe_validation_error",
    "parse_app_config",
    "serve_switches",
]
