"""schemathesis against the live stub and proxy from their OpenAPI specs: no unexplained 5xx, and
nothing recorded (no attempt row, no movement) for a request rejected as invalid."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests.railproxy.conftest import proxy_settings
from tests.servers import ServerThread

# 5xx answers that are documented rejections (nothing forwarded), not crashes.
_DOCUMENTED_5XX = {"DEADLINE_EXCEEDED", "CIRCUIT_OPEN", "ADMISSION_FULL", "RAIL_UNAVAILABLE"}
_FUZZ = settings(
    max_examples=20, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def fuzz_proxy(rail_db: str, stub_server: ServerThread) -> Iterator[ServerThread]:
    from railproxy import create_app

    server = ServerThread(create_app(proxy_settings(rail_db, stub_server.url, rail_timeout_s=2)))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def proxy_api(fuzz_proxy: ServerThread) -> Any:
    return schemathesis.openapi.from_url(f"{fuzz_proxy.url}/openapi.json")


@pytest.fixture
def stub_api(stub_server: ServerThread) -> Any:
    # Admin endpoints are test tooling (they can switch on outages and stalls): not fuzzed.
    return schemathesis.openapi.from_url(f"{stub_server.url}/openapi.json").exclude(
        path_regex="^/admin"
    )


def _json(response: Any) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _assert_no_crash(response: Any) -> None:
    if response.status_code >= 500:
        body = _json(response)
        assert body.get("code") in _DOCUMENTED_5XX, (response.status_code, response.text)
        assert body.get("handoff_certainty") == "NOT_SUBMITTED"


def _stub_movements(stub_url: str, reference: object) -> int:
    if not isinstance(reference, str):
        return 0
    r = httpx.get(f"{stub_url}/admin/movements", params={"client_reference": reference})
    return len(r.json()["movements"])


def _attempts(proxy_url: str, payout_id: object) -> int:
    if not isinstance(payout_id, str) or not payout_id:
        return 0
    r = httpx.get(f"{proxy_url}/v1/payouts/{quote(payout_id, safe='')}/attempts")
    return len(r.json()["attempts"]) if r.status_code == 200 else 0


def _fuzz(api: Any, mode: str, run_case: Any) -> int:
    """Run `run_case` on examples of every operation; returns how many operations were fuzzed."""
    generation_mode = schemathesis.GenerationMode(mode)
    fuzzed = 0
    for operation in (result.ok() for result in api.get_all_operations()):

        @_FUZZ
        @given(case=operation.as_strategy(generation_mode=generation_mode))
        def run(case: Any) -> None:
            run_case(case)

        try:
            run()
        except Unsatisfiable:
            # Negative mode cannot invent an invalid call to an operation with no inputs.
            assert mode == "negative" and not operation.body and not operation.query
            continue
        fuzzed += 1
    return fuzzed


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_proxy_api_fuzz(
    mode: str, proxy_api: Any, fuzz_proxy: ServerThread, stub_server: ServerThread
) -> None:
    """Fuzzed proxy calls never crash, and an invalid submit records and forwards nothing."""

    def run_case(case: Any) -> None:
        body = case.body if isinstance(case.body, dict) and case.path == "/v1/submissions" else {}
        before = (
            _attempts(fuzz_proxy.url, body.get("payout_id")),
            _stub_movements(stub_server.url, body.get("client_reference")),
        )
        response = case.call()
        _assert_no_crash(response)
        if case.path == "/v1/submissions" and response.status_code == 422:
            assert _json(response).get("code") == "INVALID_REQUEST"
            after = (
                _attempts(fuzz_proxy.url, body.get("payout_id")),
                _stub_movements(stub_server.url, body.get("client_reference")),
            )
            assert after == before

    assert _fuzz(proxy_api, mode, run_case) == (4 if mode == "positive" else 3)


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_stub_api_fuzz(mode: str, stub_api: Any, stub_server: ServerThread) -> None:
    """Fuzzed stub calls never answer 5xx, and an invalid payment records no movement."""

    def run_case(case: Any) -> None:
        body = case.body if isinstance(case.body, dict) else {}
        before = _stub_movements(stub_server.url, body.get("client_reference"))
        response = case.call()
        assert response.status_code < 500, response.text
        if response.status_code == 422:
            assert _stub_movements(stub_server.url, body.get("client_reference")) == before

    assert _fuzz(stub_api, mode, run_case) == (3 if mode == "positive" else 2)
