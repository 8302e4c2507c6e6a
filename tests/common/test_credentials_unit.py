"""common.credentials on its own: file loading, constant-time matching, the FastAPI dependency
(through a real ASGI app in process), token reading and generation."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import httpx
import pytest
from fastapi import Depends, FastAPI

from common.credentials import (
    ANONYMOUS,
    Credentials,
    CredentialsError,
    Identity,
    authenticate_operator,
    issue_tokens,
    operator_token,
    read_token,
    require,
    token_digest,
    write_credentials,
)


@pytest.fixture
def issued(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    kinds = {"local-operator": "operator", "worker": "component", "outbox": "component"}
    files = issue_tokens(tmp_path / "tokens", kinds)  # type: ignore[arg-type]
    path = write_credentials(tmp_path / "svc.json", kinds, files)  # type: ignore[arg-type]
    tokens = {name: f.read_text().strip() for name, f in files.items()}
    return path, tokens


def test_generated_files_are_private_and_hold_only_digests(
    issued: tuple[Path, dict[str, str]],
) -> None:
    path, tokens = issued
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert all(t not in text for t in tokens.values())
    assert token_digest(tokens["worker"]) in text


def test_authenticate_maps_each_token_to_its_identity(issued: tuple[Path, dict[str, str]]) -> None:
    path, tokens = issued
    creds = Credentials.load(path)
    assert creds.authenticate(tokens["worker"]) == Identity("worker", "component")
    assert creds.authenticate(tokens["local-operator"]) == Identity("local-operator", "operator")
    assert creds.authenticate("not-a-token") is None
    assert creds.authenticate(None) is None
    assert creds.authenticate("") is None


def test_issue_keeps_existing_tokens(tmp_path: Path) -> None:
    first = issue_tokens(tmp_path, {"worker": "component"})["worker"].read_text()
    again = issue_tokens(tmp_path, {"worker": "component"})["worker"].read_text()
    assert first == again


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("not json", "not JSON"),
        ('{"credentials": 3}', "expected"),
        ('{"credentials": [{"sha256": "xx", "identity": "a", "kind": "operator"}]}', "sha256"),
        (
            '{"credentials": [{"sha256": "'
            + "a" * 64
            + '", "identity": "a b", "kind": "operator"}]}',
            "identity",
        ),
        (
            '{"credentials": [{"sha256": "' + "a" * 64 + '", "identity": "a", "kind": "root"}]}',
            "kind",
        ),
    ],
)
def test_bad_files_are_one_line_errors(tmp_path: Path, content: str, why: str) -> None:
    p = tmp_path / "c.json"
    p.write_text(content)
    p.chmod(0o600)
    with pytest.raises(CredentialsError, match=why) as info:
        Credentials.load(p)
    assert "\n" not in str(info.value)


def test_a_file_others_can_read_is_refused(issued: tuple[Path, dict[str, str]]) -> None:
    path, _ = issued
    path.chmod(0o644)
    with pytest.raises(CredentialsError, match="readable by others"):
        Credentials.load(path)


def test_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="cannot read"):
        Credentials.load(tmp_path / "absent.json")


def _app(creds: Credentials | None) -> FastAPI:
    app = FastAPI()
    calls: list[str] = []
    app.state.calls = calls

    operator = Depends(require(creds, operator=True))

    @app.post("/op")
    async def op(who: Identity = operator) -> dict[str, str]:
        calls.append(who.name)
        return {"who": who.name}

    @app.post("/worker", dependencies=[Depends(require(creds, components=("worker",)))])
    async def worker() -> dict[str, str]:
        calls.append("worker")
        return {"ok": "yes"}

    return app


async def _post(app: FastAPI, path: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.post(path, headers=headers)


async def test_dependency_401_403_and_ok(issued: tuple[Path, dict[str, str]]) -> None:
    path, tokens = issued
    app = _app(Credentials.load(path))
    r = await _post(app, "/op", None)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert (await _post(app, "/op", "forged")).status_code == 401
    assert (await _post(app, "/op", tokens["worker"])).status_code == 403
    assert (await _post(app, "/worker", tokens["outbox"])).status_code == 403
    assert (await _post(app, "/worker", tokens["local-operator"])).status_code == 403
    assert app.state.calls == []  # no handler ran for a refused call
    r = await _post(app, "/op", tokens["local-operator"])
    assert r.status_code == 200 and r.json() == {"who": "local-operator"}
    assert (await _post(app, "/worker", tokens["worker"])).status_code == 200
    assert app.state.calls == ["local-operator", "worker"]


async def test_negative_control_without_credentials_anyone_passes() -> None:
    app = _app(None)
    r = await _post(app, "/op", None)
    assert r.status_code == 200 and r.json() == {"who": ANONYMOUS.name}


def test_read_token_prefers_the_value_then_the_file(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("from-file\n")
    assert read_token(token="v", token_file=f) == "v"
    assert read_token(token_file=f) == "from-file"
    assert read_token() is None
    (tmp_path / "empty").write_text("")
    with pytest.raises(CredentialsError, match="empty"):
        read_token(token_file=tmp_path / "empty")
    with pytest.raises(CredentialsError):
        read_token(token_file=tmp_path / "nope")


def test_operator_token_from_environment(tmp_path: Path) -> None:
    f = tmp_path / "op"
    f.write_text("tok\n")
    assert operator_token({"PAYOUTS_OPERATOR_TOKEN_FILE": str(f)}) == "tok"
    assert operator_token({"PAYOUTS_OPERATOR_TOKEN": "x"}) == "x"
    assert operator_token({}) is None


def test_authenticate_operator(issued: tuple[Path, dict[str, str]]) -> None:
    path, tokens = issued
    assert authenticate_operator(path, tokens["local-operator"]).name == "local-operator"
    with pytest.raises(CredentialsError, match="component"):
        authenticate_operator(path, tokens["worker"])
    with pytest.raises(CredentialsError, match="not known"):
        authenticate_operator(path, "forged")
    with pytest.raises(CredentialsError, match="no operator token"):
        authenticate_operator(path, None)
    with pytest.raises(CredentialsError, match="no credentials file"):
        authenticate_operator(None, tokens["local-operator"])


def test_digest_file_round_trip_is_plain_json(issued: tuple[Path, dict[str, str]]) -> None:
    path, _ = issued
    body = json.loads(path.read_text())
    assert {c["identity"] for c in body["credentials"]} == {"local-operator", "worker", "outbox"}
    assert os.access(path, os.R_OK)
