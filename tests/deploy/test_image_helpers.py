"""The image's HEALTHCHECK probe against a real HTTP server, and the compose secrets generator."""

from __future__ import annotations

import http.server
import re
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from common import healthcheck
from common.db_roles import ROLE_NAMES, read_passwords
from tests.deploy.conftest import ROOT


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_healthcheck_passes_on_2xx_and_fails_otherwise(server: str) -> None:
    assert healthcheck.main([f"{server}/health"]) == 0
    assert healthcheck.main([f"{server}/unhealthy"]) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert healthcheck.main([f"http://127.0.0.1:{closed}/health"]) == 1
    assert healthcheck.main(["file:///etc/passwd"]) == 1


def test_healthcheck_needs_a_url(monkeypatch: pytest.MonkeyPatch, server: str) -> None:
    monkeypatch.delenv("HEALTHCHECK_URL", raising=False)
    assert healthcheck.main([]) == 1
    monkeypatch.setenv("HEALTHCHECK_URL", f"{server}/health")
    assert healthcheck.main([]) == 0


def test_gen_env_writes_private_random_secrets_once(tmp_path: Path) -> None:
    env, keys = tmp_path / "compose.env", tmp_path / "secrets"
    cmd = [
        sys.executable,
        str(ROOT / "deploy" / "gen_env.py"),
        "--env-file",
        str(env),
        "--secrets-dir",
        str(keys),
    ]
    subprocess.run(cmd, check=True, capture_output=True)
    first = env.read_text()
    values = dict(line.split("=", 1) for line in first.splitlines() if not line.startswith("#"))
    compose_vars = set(
        re.findall(r"\$\{([A-Z_]+_PASSWORD):\?", (ROOT / "docker-compose.yml").read_text())
    )
    assert set(values) == compose_vars  # every password compose needs, nothing else
    assert len(set(values.values())) == len(values) and all(len(v) >= 32 for v in values.values())
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.stat().st_mode) == 0o700
    assert (keys / "private" / "compose-k1.pem").read_text().startswith("-----BEGIN PRIVATE KEY")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    assert "kept" in out and env.read_text() == first  # a second run changes nothing
    for value in values.values():
        assert value not in out
    # The migrations' roles (docs/database-roles.md): one 0600 file each, which the migrate job
    # sets as the role's password, and the same value in the env file for the component's DSN.
    roles = keys / "credentials" / "db-roles"
    assert stat.S_IMODE(roles.stat().st_mode) == 0o700
    for role in ROLE_NAMES:
        assert stat.S_IMODE((roles / role).stat().st_mode) == 0o600
        assert values[f"{role.upper()}_DB_PASSWORD"] == (roles / role).read_text().strip()
    assert read_passwords(roles).keys() == set(ROLE_NAMES)  # what `payouts db migrate` accepts
    # --force replaces the env file but keeps the role passwords the database already has.
    subprocess.run([*cmd, "--force"], check=True, capture_output=True)
    lines = env.read_text().splitlines()
    forced = dict(line.split("=", 1) for line in lines if not line.startswith("#"))
    assert forced["POSTGRES_PASSWORD"] != values["POSTGRES_PASSWORD"]
    for role in ROLE_NAMES:
        var = f"{role.upper()}_DB_PASSWORD"
        assert forced[var] == values[var], var


def test_healthcheck_verifies_an_https_url_against_its_ca(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """HEALTHCHECK_CA_FILE (docker-compose.yml's tls-ca): the server's own CA passes, another
    CA's certificate fails the probe (negative control), and so does plain HTTP to it."""
    import ssl

    from stack.pki import StackPKI

    pki, other = StackPKI(tmp_path / "ours"), StackPKI(tmp_path / "other")
    files = pki.issue("server")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(files.cert, files.key)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"https://127.0.0.1:{httpd.server_address[1]}/health"
    try:
        monkeypatch.setenv("HEALTHCHECK_CA_FILE", str(pki.ca_file))
        assert healthcheck.main([url]) == 0
        assert healthcheck.main([url.replace("https://", "http://")]) == 1
        monkeypatch.setenv("HEALTHCHECK_CA_FILE", str(other.ensure_ca()))
        assert healthcheck.main([url]) == 1
    finally:
        httpd.shutdown()
        httpd.server_close()
