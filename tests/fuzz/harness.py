"""A bounded schemathesis run of one service's OpenAPI spec with schemathesis's own checks.

Every operation of the spec is called with `max_examples` positive and `max_examples` negative
examples; every response goes through `case.validate_response` with `CHECKS`. Failures are
collected (not raised at the first one) so that one run reports every operation that broke, and
the caller asserts that none did.

`EXCLUSIONS` is the one table of what is NOT checked, each with its justification; it is
repeated in docs/api-conformance.md (a test keeps the two in step).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    missing_required_header,
    negative_data_rejection,
    positive_data_acceptance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

#: Headers per service ("lock", "proxy", "stub", "finledger"): the single hook through which an
#: each service's bearer credential (the `fuzz_headers` fixture); a path may need another
#: identity than the rest of its service (the lock server's break-glass routes need an operator).
HeadersFor = Callable[[str], "CaseHeaders"]
#: The headers of one request, chosen by its path.
CaseHeaders = Callable[[str], Mapping[str, str]]


def no_server_error_but_not_submitted(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis's `not_a_server_error`, except the documented 5xx rejections of the rail
    proxy: a body with `handoff_certainty == NOT_SUBMITTED` says nothing was forwarded (circuit
    open, admission full, deadline, rail unavailable) -- an answer, not a crash."""
    if response.status_code >= 500:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and body.get("handoff_certainty") == "NOT_SUBMITTED":
            return None
    return not_a_server_error(ctx, response, case)


#: The checks every response goes through. schemathesis's stateful checks (use_after_free,
#: ensure_resource_availability) need its stateful runner and OpenAPI links, which no spec
#: declares (see EXCLUSIONS). `ignored_auth` resends each request without its bearer token
#: (the specs declare the scheme) and fails unless the service refuses it.
CHECKS: list[Any] = [
    no_server_error_but_not_submitted,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    missing_required_header,
    unsupported_method,
    allow_header_conformance,
    ignored_auth,
]

#: (service, what is excluded, why). The only exclusions; docs/api-conformance.md lists the same.
EXCLUSIONS: list[tuple[str, str, str]] = [
    (
        "all",
        "`not_a_server_error` for a 5xx whose body has handoff_certainty NOT_SUBMITTED",
        "the rail proxy's documented fail-fast answers (CIRCUIT_OPEN, ADMISSION_FULL, "
        "DEADLINE_EXCEEDED, RAIL_UNAVAILABLE): nothing was forwarded or recorded",
    ),
    (
        "rail stub, finance ledger",
        "paths under /admin",
        "test tooling of the stand-ins (switch on outages, stalls, ambiguity; reset the "
        "evidence): not part of the contract a real rail or ledger offers",
    ),
    (
        "rail stub",
        "fuzzed on its own instance, not the system's",
        "the stub stands for the third-party rail; POST /payments on it moves money by "
        "definition, and a movement nobody asked for is exactly what INV-02 reports",
    ),
    (
        "all",
        "stateful checks (use_after_free, ensure_resource_availability)",
        "no spec declares OpenAPI links",
    ),
    (
        "all",
        "negative cases whose query value has no faithful form on the wire",
        "an empty list serialises to nothing and a nested list or an object to something "
        "else, so the server never sees the violation the case was made for",
    ),
    (
        "worker",
        "activities/worker_http.py",
        "a standard-library HTTP server with /health and /metrics only: it has no OpenAPI spec",
    ),
]


@dataclass
class FuzzStats:
    """What one run did: operations fuzzed, examples sent, checks run, and the failures."""

    service: str
    operations: int = 0
    examples: int = 0
    checks: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.service}: {self.operations} operations, {self.examples} examples, "
            f"{self.checks} checks, {len(self.failures)} failures, statuses {self.statuses}"
        )


def future_deadlines(case: Any) -> None:
    """Give a proxy submission a deadline in the future, so that it is refused for what it is
    (its made-up grant), not for a deadline that had already passed."""
    body = case.body
    if case.path == "/v1/submissions" and isinstance(body, dict):
        context = body.get("context")
        if isinstance(context, dict) and "deadline_at" in context:
            context["deadline_at"] = (datetime.now(UTC) + timedelta(seconds=30)).isoformat()


def fuzz(
    service: str,
    schema: Any,
    *,
    headers: CaseHeaders,
    max_examples: int,
    prepare: Callable[[Any], None] | None = None,
    after: Callable[[Any, Any], None] | None = None,
) -> FuzzStats:
    """Fuzz every operation of `schema` in both modes; `prepare` may adjust a positive case
    before it is sent, `after(case, response)` may check what the response left behind."""
    stats = FuzzStats(service)
    for result in schema.get_all_operations():
        operation = result.ok()
        stats.operations += 1
        for mode in ("positive", "negative"):
            run = _runner(stats, operation, mode, headers, prepare, after, max_examples)
            try:
                run()
            except Unsatisfiable:
                # Negative mode cannot invent an invalid call to an operation without inputs.
                continue
    return stats


def _unsendable_negative(case: Any) -> bool:
    query = case.query if isinstance(case.query, dict) else {}

    def unsendable(value: object) -> bool:
        if isinstance(value, dict) or value == []:
            return True
        return isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value)

    return any(unsendable(value) for value in query.values())


def _runner(
    stats: FuzzStats,
    operation: Any,
    mode: str,
    headers: CaseHeaders,
    prepare: Callable[[Any], None] | None,
    after: Callable[[Any, Any], None] | None,
    max_examples: int,
) -> Callable[[], None]:
    strategy = operation.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,  # the same examples every run: a failure reproduces
    )
    @given(case=strategy)
    def run(case: Any) -> None:
        # A negative query value with no faithful form on the wire (an empty list serialises to
        # nothing, a nested list or an object to something else) is not a violation the server
        # can see: skip it (EXCLUSIONS).
        assume(mode == "positive" or not _unsendable_negative(case))
        if prepare is not None and mode == "positive":
            prepare(case)
        sent_headers = dict(headers(case.path))
        response = case.call(headers=sent_headers, timeout=30)
        stats.examples += 1
        stats.checks += len(CHECKS)
        stats.statuses[response.status_code] = stats.statuses.get(response.status_code, 0) + 1
        try:
            case.validate_response(response, checks=CHECKS, headers=sent_headers)
        except (FailureGroup, Failure) as exc:
            for failure in exc.exceptions if isinstance(exc, FailureGroup) else (exc,):
                sent = f"query {case.query!r} body {case.body!r}"[:400]
                stats.failures.append(
                    f"{operation.label} [{mode}] {failure.code} {failure.title}:"
                    f" {response.status_code} {response.text[:300]} (sent {sent})"
                )
        if after is not None:
            after(case, response)

    return run
