"""Bearer-token credentials for tests: one generated set per test process (never committed),
made by the stack's own generator (stack.services.stack_credentials), so the fixtures
wire the processes they start exactly as `payouts up` does."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from common.credentials import auth_headers, read_token
from stack.services import STACK_OPERATOR, StackCredentials, stack_credentials

OPERATOR = STACK_OPERATOR


@functools.cache
def credentials() -> StackCredentials:
    return stack_credentials(Path(tempfile.mkdtemp(prefix="test-creds-")))


def token(identity: str) -> str:
    value = read_token(token_file=credentials().tokens[identity], what=identity)
    assert value is not None
    return value


def token_file(identity: str) -> str:
    return str(credentials().tokens[identity])


def headers(identity: str = OPERATOR) -> dict[str, str]:
    return auth_headers(token(identity))


def server_env(server: str) -> dict[str, str]:
    """The credentials variable of a served process: lock-server, railstub, railproxy, finledger."""
    variable = {
        "lock-server": "LOCK_CREDENTIALS_PATH",
        "railstub": "RAILSTUB_CREDENTIALS_PATH",
        "railproxy": "RAILPROXY_CREDENTIALS_PATH",
        "finledger": "FINLEDGER_CREDENTIALS_PATH",
    }[server]
    env = {variable: str(credentials().servers[server])}
    if server == "railproxy":
        env["RAILPROXY_TOKEN_FILE"] = token_file("railproxy")
    return env
