"""Property-based tests of `tuner serve` against its own OpenAPI schema (schemathesis, in process):
for generated queries, valid and invalid, every answer has a documented status, is JSON of the
documented shape, and is never a server error; an error is one line."""

from __future__ import annotations

import pytest
import schemathesis
from schemathesis.checks import positive_data_acceptance
from hypothesis import HealthCheck, given, settings


def _check(case: schemathesis.Case) -> None:
    # Every check but positive_data_acceptance: the schema cannot say which shapes a family
    # takes (attention: four dims, D of 64, 96, 128 or 256), so a query it allows may get a 400.
    answer = case.call_and_validate(excluded_checks=[positive_data_acceptance])
    assert answer.status_code < 500
    if answer.status_code >= 400:
        detail = answer.json()["detail"]
        assert isinstance(detail, str) and "\n" not in detail and "Traceback" not in detail


@pytest.mark.parametrize("path, method", [(p, "GET") for p in ("/best", "/export", "/studies", "/studies/{study}",
                                                                 "/coverage", "/families", "/jobs", "/jobs/{job_id}")]
                         + [("/jobs", "POST"), ("/jobs/{job_id}", "DELETE")])
def test_every_answer_is_documented_and_no_query_breaks_the_server(app, path, method):
    """Each operation's queries drawn from the schema (its examples first, then generated ones,
    valid and not): schemathesis checks status, content type, and the body against the schema."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operation = schema["/" + path.lstrip("/")][method]
    strategy = operation.as_strategy()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=strategy)
    def run(case: schemathesis.Case) -> None:
        _check(case)

    run()


def test_the_schema_names_the_families_flags_as_on_the_command_line(client):
    document = client.get("/openapi.json").json()
    for path in ("/best", "/export"):
        parameters = {p["name"]: p for p in document["paths"][path]["get"]["parameters"]}
        assert {"family", "shape", "dtype", "device", "causal", "epilogue", "layout"} <= set(parameters)
        assert parameters["causal"]["schema"] == {"type": "boolean"} and not parameters["causal"]["required"]
        assert "nt" in parameters["layout"]["schema"]["enum"] and parameters["family"]["required"]
    assert set(document["paths"]) == {"/best", "/export", "/studies", "/studies/{study}", "/coverage", "/families",
                                      "/jobs", "/jobs/{job_id}"}
    assert document["paths"]["/jobs"]["post"]["security"] == [{"bearer": []}]
    assert document["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
