"""`edgespec serve`'s HTTP API fuzzed from its own OpenAPI schema (schemathesis): bodies the schema allows and
bodies it does not, for every operation, against the app over a fake engine. Each answer must be no 5xx, with a
status code and a content type the schema documents, and a body that matches the schema it documents there.

A schema-valid request may still be refused (a 400: n other than 1, a tool without a name, a role's content
missing); the schema cannot say all of that, so schemathesis' "valid data must be accepted" check is left out."""

import pytest
from fake import controller
from hypothesis import HealthCheck, settings
from test_server_hardening import Utf8Fake

from edgespec.api import Engine

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("fastapi")

from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from edgespec.server import create_app  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]
APP = create_app(Engine(Utf8Fake(), None, controller()), default_max_tokens=8)
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)


FUZZ = settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
# A test an operation, each its own pytest item. One test over SCHEMA.parametrize() reports its operations as items
# of one name (pytest 9's subtests), which pytest-xdist (make test) ran as one: a failing operation passed there.
FUZZED: set[str] = set()  # the operations the tests below fuzz, as schemathesis labels them


def fuzzed(method: str, path: str):
    """A test of one operation: each answer to the bodies generated for it as the schema documents."""
    FUZZED.add(f"{method} {path}")

    @SCHEMA.include(method=method, path=path).parametrize()
    @FUZZ
    def test(case):
        case.call_and_validate(checks=CHECKS)

    return test


test_health_answers_as_the_schema_documents = fuzzed("GET", "/health")
test_metrics_answers_as_the_schema_documents = fuzzed("GET", "/metrics")
test_models_answers_as_the_schema_documents = fuzzed("GET", "/v1/models")
test_chat_completions_answers_as_the_schema_documents = fuzzed("POST", "/v1/chat/completions")
test_completions_answers_as_the_schema_documents = fuzzed("POST", "/v1/completions")


def test_every_operation_of_the_schema_is_fuzzed():
    """A new route gets a test above, or this fails (and a test above names a route the schema has)."""
    assert {result.ok().label for result in SCHEMA.get_all_operations()} == FUZZED
