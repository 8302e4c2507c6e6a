"""Least privilege: the worker's reconcile activity reads the rail's movement log with the
`reconciler` component's own credential only, never the operator's (whose every action is
authorised and attributed to a person). Against a real, authenticating rail stub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from common.credentials import OPERATOR_TOKEN_ENV, OPERATOR_TOKEN_FILE_ENV
from railstub import create_app
from railstub.client import MovementLogUnavailable
from railstub.settings import StubSettings
from reconcile.reconciler import component_movement_source, reconciler_token, stub_movement_source
from tests.credentials import OPERATOR, credentials, token_file
from tests.servers import ServerThread


@pytest.fixture(scope="module")
def authenticating_stub() -> Iterator[str]:
    """A rail stub that admits the operator and the reconciler to its movement log."""
    server = ServerThread(
        create_app(StubSettings(credentials_path=credentials().servers["railstub"]))
    )
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def operator_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's token is in the environment, as on an operator's shell or a careless host."""
    monkeypatch.delenv(OPERATOR_TOKEN_ENV, raising=False)
    monkeypatch.setenv(OPERATOR_TOKEN_FILE_ENV, token_file(OPERATOR))


async def test_with_its_own_token_the_worker_reads_the_movement_log(
    authenticating_stub: str,
) -> None:
    movements = await component_movement_source(authenticating_stub, token_file("reconciler"))()
    assert list(movements) == []  # read (the stub is fresh), not refused


@pytest.mark.usefixtures("operator_in_env")
async def test_without_its_own_token_the_worker_never_borrows_the_operators(
    authenticating_stub: str,
) -> None:
    """The control first: the operator's token, which is in the environment, WOULD be admitted
    (the command-line fallback reads with it), so the refusal below is the worker's choice."""
    by_hand = stub_movement_source(authenticating_stub, token=reconciler_token(None))
    assert list(await by_hand()) == []
    with pytest.raises(MovementLogUnavailable, match="RECONCILE_TOKEN_FILE is not set"):
        await component_movement_source(authenticating_stub, None)()
