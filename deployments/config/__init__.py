"""Every setting of the application, declared once (pydantic, `extra="forbid"`, units in names):
`app` (the `args:` of serve_config.yaml, validated once at build time), the settings of the
gateway's `security` and `state`, and `serve_file` (a whole config file checked before deploy,
or narrowed by the tools that deploy part of it)."""

from deployments.config.app import (
    APP_DEPLOYMENTS,
    MIB,
    PROJECT_ROOT,
    AppConfig,
    BatchingConfig,
    CacheConfig,
    CoalesceConfig,
    ConfigError,
    ListenerConfig,
    ModelConfig,
    RouterConfig,
    describe_validation_error,
    parse_app_config,
    serve_switches,
)
from deployments.config.serve_file import (
    check_serve_config,
    main,
    serve_only,
    set_router_listener,
    without_regions,
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
    "ListenerConfig",
    "ModelConfig",
    "RouterConfig",
    "check_serve_config",
    "describe_validation_error",
    "main",
    "parse_app_config",
    "serve_only",
    "serve_switches",
    "set_router_listener",
    "without_regions",
]
