"""Schemathesis against the OpenAPI schema (no 5xx, answers match the schema), bounded."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from headscope.config import Settings  # noqa: E402
from headscope.web.main import create_app  # noqa: E402

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_openapi_fuzz(case, base_url):
    case.call_and_validate(
        base_url=base_url,
        timeout=60,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance],
    )
