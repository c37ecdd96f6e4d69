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


@SCHEMA.parametrize()
@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_every_answer_is_as_the_schema_documents(case):
    case.call_and_validate(checks=CHECKS)
