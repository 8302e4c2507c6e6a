"""Lock-server tests over HTTP against a real uvicorn server and both real backends: bad input
gets a 4xx JSON error and changes nothing, metrics carry no key/session/token label, OpenAPI is
served, and each grant is one `lock.acquired` event."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from lockservice.server import create_app
from tests.lockservice import server_fixtures as _fx
from tests.lockservice.fake_backend import FakeBackend

fake_backend = _fx.fake_backend  # fixture
live_server = _fx.live_server  # fixture
real_backend = _fx.real_backend  # fixture

KEY = "payout:acct-1"


async def _state(http: httpx.AsyncClient, key: str) -> dict[str, Any]:
    r = await http.get("/v1/locks", params={"key": key})
    assert r.status_code == 200, r.text
    body = r.json()
    return {k: body[k] for k in ("holder_session", "token", "last_token")}


def _bad_requests(
    sid: str, grant: dict[str, Any]
) -> list[tuple[str, str, dict[str, Any], int, str]]:
    """(method, path, httpx kwargs, expected status, expected code) for every kind of bad input."""
    other = dict(grant, session_id="0" * 32)
    return [
        ("POST", "/v1/sessions", {"json": {"ttl_s": 0}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"json": {"ttl_s": -5}}, 422, "invalid_request"),
        ("POST", "/v1/sessions", {"json": {"ttl_s": "abc"}}, 422, "invalid_request"),
        ("POST", "/v1/sessions/nope/keepalive", {}, 404, "session_not_found"),
        (
            "POST",
            "/v1/locks/acquire",
            {"content": b"{not json", "headers": {"content-type": "application/json"}},
            422,
            "invalid_request",
        ),
        ("POST", "/v1/locks/acquire", {"json": [1, 2]}, 422, "invalid_request"),
        ("POST", "/v1/locks/acquire", {"json": {"session_id": sid}}, 422, "invalid_request"),
        (
            "POST",
            "/v1/locks/acquire",
            {"json": {"session_id": "no-such-session", "key": KEY}},
            404,
            "session_not_found",
        ),
        (
            "POST",
            "/v1/locks/acquire",
            {"json": {"session_id": sid, "key": ""}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/locks/acquire",
            {"json": {"session_id": sid, "key": "k" * 257}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/locks/acquire",
            {"json": {"session_id": sid, "key": "bad key!"}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/locks/acquire",
            {"json": {"session_id": sid, "key": KEY, "wait_s": -1}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/locks/renew",
            {"json": dict(grant, token=grant["token"] + 1)},
            409,
            "not_held",
        ),
        ("POST", "/v1/locks/renew", {"json": dict(grant, token="x")}, 422, "invalid_request"),
        (
            "POST",
            "/v1/locks/release",
            {"json": dict(grant, token=grant["token"] - 1)},
            409,
            "not_held",
        ),
        ("POST", "/v1/locks/release", {"json": other}, 409, "not_held"),
        ("POST", "/v1/locks/release", {"json": dict(grant, token=2**70)}, 422, "invalid_request"),
        # No reason (the operator is the credential's identity now, never a body field).
        ("POST", "/v1/locks/revoke", {"json": {"key": KEY}}, 422, "invalid_request"),
        (
            "POST",
            "/v1/locks/revoke",
            {"json": {"key": KEY, "operator": "ann"}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/locks/revoke",
            {"json": {"key": KEY, "operator": "ann", "reason": "   "}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/epoch/bump",
            {"json": {"min_epoch": 1, "operator": "ann"}},
            422,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/epoch/bump",
            {"json": {"min_epoch": -1, "operator": "a", "reason": "r"}},
            422,
            "invalid_request",
        ),
        ("GET", "/v1/locks", {"params": {"key": ""}}, 422, "invalid_request"),
        ("GET", "/v1/locks", {"params": {"key": "k" * 300}}, 422, "invalid_request"),
        ("GET", "/v1/nothing-here", {}, 404, "not_found"),
        ("DELETE", "/v1/locks/acquire", {}, 405, "method_not_allowed"),
    ]


async def test_bad_input_gets_4xx_json_and_changes_nothing(live_server: str) -> None:
    """Every kind of bad input gets a 4xx JSON {code, message} and leaves the lock as it was."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": KEY})
        assert r.status_code == 200, r.text
        grant = r.json()
        before = await _state(http, KEY)
        assert before["holder_session"] == sid and before["token"] == grant["token"]

        for method, path, kwargs, status, code in _bad_requests(sid, grant):
            resp = await http.request(method, path, **kwargs)
            assert (resp.status_code, resp.json().get("code")) == (status, code), (
                method,
                path,
                kwargs,
                resp.text,
            )
            assert resp.json()["message"], resp.text
            if status == 405:  # RFC 9110: a 405 names the methods the resource allows
                assert resp.headers.get("allow") == "POST", resp.headers
            assert await _state(http, KEY) == before, (method, path, kwargs)

        # Negative control: a valid release does change the state, so the check above can fail.
        assert (await http.post("/v1/locks/release", json=grant)).status_code == 204
        assert (await _state(http, KEY))["holder_session"] is None


async def test_closed_session_is_rejected(live_server: str) -> None:
    """A closed session cannot keep alive or acquire: 404 session_not_found, lock stays free."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        assert (await http.delete(f"/v1/sessions/{sid}")).status_code == 204
        r = await http.post(f"/v1/sessions/{sid}/keepalive")
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
        r = await http.post("/v1/locks/acquire", json={"session_id": sid, "key": KEY})
        assert (r.status_code, r.json()["code"]) == (404, "session_not_found")
        assert (await _state(http, KEY))["holder_session"] is None


async def test_not_acquired_is_409_with_reason(live_server: str) -> None:
    """A held key gives a second session 409 {code: not_acquired, reason: held}."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        s1 = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        s2 = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        assert (
            await http.post("/v1/locks/acquire", json={"session_id": s1, "key": KEY})
        ).is_success
        r = await http.post("/v1/locks/acquire", json={"session_id": s2, "key": KEY, "wait_s": 0})
        assert r.status_code == 409
        assert r.json()["code"] == "not_acquired" and r.json()["reason"] == "held"


def metric_label_leaks(exposition: str, secrets: list[str]) -> list[str]:
    """Label values of the exposition that contain any of `secrets` (keys, sessions, tokens)."""
    leaks = []
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name in ("le", "quantile"):  # numeric bucket bounds, set by the code
                    continue
                if any(s and s in value for s in secrets):
                    leaks.append(f"{sample.name}{{{name}={value}}}")
    return leaks


async def test_metrics_have_no_key_session_or_token_labels(live_server: str) -> None:
    """/metrics has request counts and latency by op/outcome only, never a key/session/token."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        sid = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        grant = (await http.post("/v1/locks/acquire", json={"session_id": sid, "key": KEY})).json()
        await http.post("/v1/locks/acquire", json={"session_id": sid, "key": "bad key"})
        await http.post("/v1/locks/release", json=grant)
        text = (await http.get("/metrics")).text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert "lock_requests" in families and "lock_request_seconds" in families
    ops = {
        (s.labels["op"], s.labels["outcome"])
        for s in families["lock_requests"].samples
        if s.name.endswith("_total")
    }
    assert {("acquire", "ok"), ("release", "ok"), ("acquire", "invalid")} <= ops
    secrets = [KEY, "acct-1", sid, str(grant["token"])]
    assert metric_label_leaks(text, secrets) == []
    # Negative control: the checker does catch a leaking label.
    assert metric_label_leaks('x_total{key="payout:acct-1"} 1\n', secrets)


async def test_openapi_is_served(live_server: str) -> None:
    """The OpenAPI spec lists every /v1 operation and the JSON error body."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        spec = (await http.get("/openapi.json")).json()
        health = await http.get("/health")
    assert health.json() == {"status": "ok", "backend": "reachable", "replica": None}
    assert {
        "/v1/sessions",
        "/v1/sessions/{session_id}/keepalive",
        "/v1/sessions/{session_id}",
        "/v1/locks/acquire",
        "/v1/locks/renew",
        "/v1/locks/release",
        "/v1/locks",
        "/v1/locks/revoke",
        "/v1/epoch/bump",
    } <= set(spec["paths"])
    assert "ErrorBody" in spec["components"]["schemas"]


async def test_one_event_per_grant(live_server: str) -> None:
    """An acquire through the server is one lock.acquired event; a refusal is lock.not_acquired."""
    async with httpx.AsyncClient(base_url=live_server) as http:
        s1 = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        s2 = (await http.post("/v1/sessions", json={"ttl_s": 30})).json()["session_id"]
        with capture_logs() as events:
            await http.post("/v1/locks/acquire", json={"session_id": s1, "key": KEY})
            await http.post("/v1/locks/acquire", json={"session_id": s2, "key": KEY})
    names = [e["event"] for e in events]
    assert names.count("lock.acquired") == 1
    assert names.count("lock.not_acquired") == 1


async def test_unit_backend_unavailable_is_503(fake_backend: FakeBackend) -> None:
    """UNIT (fake backend): a backend outage maps to 503 backend_unavailable, never a 500."""
    fake_backend.unavailable = True
    transport = httpx.ASGITransport(app=create_app(fake_backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        r = await http.post("/v1/sessions", json={"ttl_s": 10})
    assert (r.status_code, r.json()["code"]) == (503, "backend_unavailable")


@pytest.mark.parametrize("ttl", [0, -1, 3601])
async def test_unit_bad_ttl_never_reaches_backend(fake_backend: FakeBackend, ttl: float) -> None:
    """UNIT (fake backend): an out-of-range TTL is refused before the backend is called."""
    transport = httpx.ASGITransport(app=create_app(fake_backend))
    async with httpx.AsyncClient(transport=transport, base_url="http://lock") as http:
        r = await http.post("/v1/sessions", json={"ttl_s": ttl})
    assert r.status_code == 422 and fake_backend.calls == []


async def test_health_reflects_the_backend(fake_backend: FakeBackend) -> None:
    """/health answers 200 while the backend answers a read and 503 with why when it does not;
    /livez, the process alone, stays 200 (STD01-08)."""
    async with (
        _fx.serve_app(create_app(fake_backend)) as url,
        httpx.AsyncClient(base_url=url) as http,
    ):
        assert (await http.get("/health")).status_code == 200
        fake_backend.unavailable = True
        down = await http.get("/health")
        assert down.status_code == 503 and down.json()["status"] == "unavailable", down.text
        assert (await http.get("/livez")).status_code == 200
        fake_backend.unavailable = False
        assert (await http.get("/health")).status_code == 200
