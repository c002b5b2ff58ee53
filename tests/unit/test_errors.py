"""Every ServingError: one status from the table, an OpenAI error body, and a lossless pickle."""

from __future__ import annotations

import ast
import inspect
import json
import pickle
import re
from pathlib import Path

import pytest

import deployments.errors as errors
from deployments.errors import OverloadedError, ServingError

DEPLOYMENTS = Path(errors.__file__).resolve().parent

# The one table of statuses. A new error class fails test_the_status_table_is_exhaustive until
# it is added here, with the status its clients are promised.
EXPECTED_STATUS: dict[type[ServingError], int] = {
    errors.ServingError: 500,
    errors.InvalidRequestError: 400,
    errors.EmptyInputError: 400,
    errors.InvalidUTF8Error: 400,
    errors.UnsupportedParameterError: 400,
    errors.BadHeaderValueError: 400,
    errors.ContextLengthExceededError: 400,
    errors.WrongTaskError: 400,
    errors.ContentPolicyViolationError: 400,
    errors.AuthenticationError: 401,
    errors.PermissionDeniedError: 403,
    errors.NotFoundError: 404,
    errors.ModelNotFoundError: 404,
    errors.RouteNotFoundError: 404,
    errors.ColoNotFoundError: 404,
    errors.MethodNotAllowedError: 405,
    errors.PayloadTooLargeError: 413,
    errors.RateLimitedError: 429,
    errors.BusyError: 429,
    errors.OverloadedError: 503,
    errors.ModelNotReadyError: 503,
    errors.QueueFullError: 503,
    errors.RegionNotFoundError: 404,
    errors.RegionFaultError: 503,
    errors.WaitBudgetExceededError: 503,
    errors.ControlUnavailableError: 503,
    errors.ModerationUnavailableError: 503,
    errors.InternalServerError: 500,
    errors.BudgetExceededError: 429,
    errors.KeyNotFoundError: 404,
    errors.StateUnavailableError: 503,
    errors.BudgetUnverifiableError: 503,
    errors.BatchNotFoundError: 404,
    errors.BatchExpiredError: 410,
}


def all_serving_errors() -> list[type[ServingError]]:
    """ServingError and every subclass, however deep, in a stable order."""
    found: list[type[ServingError]] = []
    pending = [ServingError]
    while pending:
        cls = pending.pop()
        if cls not in found:
            found.append(cls)
            pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: (cls.__module__, cls.__qualname__))


def classes_derived_in_source() -> set[str]:
    """Names of classes anywhere under deployments/ that derive from ServingError by name, so a
    subclass in a module this test does not import is still caught."""
    bases_of: dict[str, set[str]] = {}
    for path in sorted(DEPLOYMENTS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                names = {
                    base.id if isinstance(base, ast.Name) else base.attr
                    for base in node.bases
                    if isinstance(base, ast.Name | ast.Attribute)
                }
                bases_of.setdefault(node.name, set()).update(names)
    derived = {"ServingError"}
    changed = True
    while changed:
        changed = False
        for name, bases in bases_of.items():
            if name not in derived and bases & derived:
                derived.add(name)
                changed = True
    return derived


def make(cls: type[ServingError]) -> ServingError:
    """An instance with every optional detail set, whatever the constructor's signature."""
    parameters = inspect.signature(cls.__init__).parameters
    if "header" in parameters:
        return cls("not two numbers", header="x-client-geo")  # type: ignore[call-arg]
    kwargs: dict[str, object] = {"param": "messages", "code": "custom_code"}
    if "retry_after_s" in parameters:
        kwargs["retry_after_s"] = 7.5
    return cls(f"{cls.__name__} happened", **kwargs)  # type: ignore[arg-type]


ALL = all_serving_errors()
IDS = [cls.__name__ for cls in ALL]


def test_the_status_table_is_exhaustive():
    assert set(ALL) == set(EXPECTED_STATUS)
    assert classes_derived_in_source() == {cls.__name__ for cls in EXPECTED_STATUS}


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_status_matches_the_table_and_is_an_error_status(cls: type[ServingError]):
    assert cls.status == EXPECTED_STATUS[cls]
    assert 400 <= cls.status <= 599
    assert make(cls).status == cls.status


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_error_type_is_set_and_follows_the_status_class(cls: type[ServingError]):
    assert isinstance(cls.error_type, str) and cls.error_type
    # OpenAI's clients tell server faults from their own mistakes by this string.
    assert (cls.error_type in {"server_error", "overloaded_error"}) == (cls.status >= 500)


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_error_body_has_exactly_the_openai_fields(cls: type[ServingError]):
    error = make(cls)
    body = error.to_error_body()
    assert list(body) == ["error"]
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] == error.message == str(error)
    assert body["error"]["type"] == cls.error_type
    assert body["error"]["param"] == error.param
    assert body["error"]["code"] == error.code
    assert json.loads(json.dumps(body)) == body


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_the_default_code_applies_unless_one_is_given(cls: type[ServingError]):
    if "header" in inspect.signature(cls.__init__).parameters:
        assert make(cls).code == cls.default_code
        return
    assert cls("plain").code == cls.default_code
    assert cls("plain").param is None
    assert cls("custom", code="other").code == "other"


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_a_pickle_round_trip_keeps_everything(cls: type[ServingError]):
    # Errors raised in a replica reach the router by pickle (inside RayTaskError).
    error = make(cls)
    restored = pickle.loads(pickle.dumps(error))
    assert type(restored) is cls
    assert restored.message == error.message and str(restored) == str(error)
    assert (restored.param, restored.code) == (error.param, error.code)
    assert restored.to_error_body() == error.to_error_body()
    if isinstance(error, OverloadedError):
        assert isinstance(restored, OverloadedError)
        assert restored.retry_after_s == error.retry_after_s == 7.5


def test_each_failure_kind_has_its_own_envelope_code():
    """The Workers AI envelope's code table is exhaustive and one-to-one: every class has a code
    >= 1000 (Cloudflare's v4 envelope), and no two share one."""
    assert set(errors.ENVELOPE_CODES) == set(ALL)
    codes = list(errors.ENVELOPE_CODES.values())
    assert all(code >= 1000 for code in codes) and len(set(codes)) == len(codes)
    # Cloudflare's own code where it documents the same failure (workers-ai/platform/errors)
    assert errors.envelope_code(errors.ModelNotFoundError) == 5007
    assert errors.envelope_code(errors.PayloadTooLargeError) == 3006
    assert errors.envelope_code(errors.BusyError) == 3040


def test_the_documented_envelope_codes_are_the_table():
    """docs/api.md's error-code table says what deployments/errors.py does: code, status, class."""
    docs = (DEPLOYMENTS.parent / "docs" / "api.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d{4,5}) \| (\d{3}) \| `(\w+)` \|", docs, re.M)
    documented = {name: (int(code), int(status)) for code, status, name in rows}
    actual = {cls.__name__: (code, cls.status) for cls, code in errors.ENVELOPE_CODES.items()}
    assert documented == actual


def test_bad_header_error_names_the_header_in_param_and_message():
    error = errors.BadHeaderValueError("expected '<lat>,<lon>'", header="x-client-geo")
    assert error.param == "x-client-geo"
    assert "x-client-geo" in error.message and "expected '<lat>,<lon>'" in error.message
    assert error.code == "invalid_header"


# The headers each class adds to its response; every other class adds none.
RETRY = {"retry-after", "retry-after-ms"}
EXPECTED_HEADER_NAMES: dict[type[ServingError], set[str]] = {
    errors.RateLimitedError: {*RETRY, "x-ratelimit-remaining-requests"},
    errors.OverloadedError: RETRY,
    errors.ModelNotReadyError: RETRY,
    errors.QueueFullError: RETRY,
    errors.RegionFaultError: RETRY,
    errors.WaitBudgetExceededError: RETRY,
    errors.BusyError: RETRY,
    errors.ControlUnavailableError: RETRY,
    errors.ModerationUnavailableError: RETRY,
    errors.MethodNotAllowedError: {"allow"},
    errors.BudgetExceededError: {*RETRY, "x-ratelimit-remaining-requests"},
    errors.StateUnavailableError: RETRY,
    errors.BudgetUnverifiableError: RETRY,
}


@pytest.mark.parametrize("cls", ALL, ids=IDS)
def test_each_error_carries_its_own_response_headers(cls: type[ServingError]):
    error = make(cls)
    if isinstance(error, errors.RateLimitedError):
        error.headers = {"x-ratelimit-remaining-requests": "0"}
    if isinstance(error, errors.MethodNotAllowedError):
        error.allow = "POST"
    headers = error.response_headers()
    assert set(headers) == EXPECTED_HEADER_NAMES.get(cls, set())
    if "retry-after" in headers:
        assert headers["retry-after"] == "8"  # 7.5 s, rounded up to whole seconds
        assert headers["retry-after-ms"] == "7500"  # the same estimate, to the millisecond
    # ... and they survive the trip from a replica.
    assert pickle.loads(pickle.dumps(error)).response_headers() == headers


def test_a_subsecond_retry_hint_is_one_second_and_its_milliseconds():
    assert OverloadedError("busy", retry_after_s=0.2).response_headers() == {
        "retry-after": "1",
        "retry-after-ms": "200",
    }
    # Never 0 ("now"), however small; a fraction of a millisecond is rounded up.
    assert OverloadedError("busy", retry_after_s=0.0).response_headers()["retry-after-ms"] == "1"
    assert OverloadedError("x", retry_after_s=2.0001).response_headers() == {
        "retry-after": "3",
        "retry-after-ms": "2001",
    }


def test_not_found_errors_share_a_base_and_differ_by_code():
    for cls, code in (
        (errors.ModelNotFoundError, "model_not_found"),
        (errors.RouteNotFoundError, "route_not_found"),
        (errors.ColoNotFoundError, "colo_not_found"),
    ):
        assert issubclass(cls, errors.NotFoundError) and cls("x").code == code


def test_overloaded_defaults_to_a_retry_hint():
    assert OverloadedError("busy").retry_after_s > 0
    assert errors.ModelNotReadyError("cold", retry_after_s=3).retry_after_s == 3
