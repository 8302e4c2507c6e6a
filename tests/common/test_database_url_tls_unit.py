"""Unit tests of the PostgreSQL DSN check (common.tls.database_url_problem, issue 27 §1) and of
its refusal at real entry points: a component whose DSN would let its session be read or
redirected on the path does not start (exit 2, the variable named), outside experiment mode."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.tls import TLSSettingsError, database_url_problem, refuse_unverified_database_url
from railproxy.settings import ProxySettings

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
PAYOUTS = str(Path(sys.executable).with_name("payouts"))  # the console script, as deployed
VERIFIED = "sslmode=verify-full&sslrootcert=/etc/payouts/ca.pem"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u@127.0.0.1:5432/db",  # loopback: nothing crosses a network
        "postgresql://u@localhost/db",
        "postgresql://u@[::1]:5432/db",
        "postgresql:///db?host=/var/run/postgresql",  # a Unix socket
        "postgresql://u@127.0.0.1:1,127.0.0.1:2/db?target_session_attrs=read-write",
        f"postgresql://u@db.internal:5432/db?{VERIFIED}",
        "postgresql://u@10.1.2.3/db?sslmode=verify-ca&sslrootcert=/ca.pem",  # Cloud SQL by IP
        f"postgresql://u@a:5432,b:5432/db?{VERIFIED}",
        "postgresql://u@127.0.0.1/db?sslmode=disable",  # plaintext, but on loopback
    ],
)
def test_accepted(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    assert database_url_problem(url, "X_DATABASE_URL") is None


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://u@db.internal/db", "reaches db.internal with no sslmode"),
        ("postgresql://u@db.internal/db?sslmode=disable", "sslmode=disable"),
        ("postgresql://u@127.0.0.1/db?sslmode=require", "sslmode=require, TLS without verifying"),
        ("postgresql://u@127.0.0.1/db?sslmode=prefer", "sslmode=prefer"),
        ("postgresql://u@127.0.0.1/db?sslmode=allow", "sslmode=allow"),
        ("postgresql://u@127.0.0.1/db?ssl=no-verify", "sslmode=no-verify"),
        ("postgresql://u@127.0.0.1:1,db.internal:2/db", "reaches db.internal"),  # one remote host
        ("postgresql:///db?host=db.internal", "reaches db.internal"),
        ("postgresql://u@[2001:db8::1]:5432/db", "reaches 2001:db8::1"),
    ],
)
def test_refused(url: str, says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGSSLMODE", raising=False)
    problem = database_url_problem(url, "X_DATABASE_URL")
    assert problem is not None and problem.startswith("X_DATABASE_URL ")
    assert says in problem
    assert "sslmode=verify-full" in problem  # it says what to do instead


def test_pgsslmode_counts_when_the_dsn_names_no_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "postgresql://u@db.internal/db?sslrootcert=/ca.pem"
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    assert database_url_problem(url, "V") is None
    monkeypatch.setenv("PGSSLMODE", "require")
    assert database_url_problem(url, "V") is not None
    monkeypatch.setenv("PGSSLMODE", "verify-full")  # the DSN's own mode wins over the variable
    assert database_url_problem(url + "&sslmode=require", "V") is not None


def test_experiment_mode_lets_it_through_and_nothing_else_does() -> None:
    weak = "postgresql://u@127.0.0.1/db?sslmode=require"
    with pytest.raises(TLSSettingsError, match="refused outside experiment mode"):
        refuse_unverified_database_url(weak, "V")
    refuse_unverified_database_url(weak, "V", experiment_mode=True)
    refuse_unverified_database_url(None, "V")  # unset: the component's own default applies


def test_the_proxys_settings_refuse_it_outside_experiment_mode() -> None:
    weak = "postgresql://u@127.0.0.1/db?sslmode=require"
    with pytest.raises(ValueError, match="RAILPROXY_DATABASE_URL asks for sslmode=require"):
        ProxySettings(database_url=weak)
    assert ProxySettings(database_url=weak, experiment_mode=True).database_url == weak


def _entry(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        check=False,
        env={"PATH": os.environ.get("PATH", ""), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("argv", "variable"),
    [
        ([PY, "-m", "lockservice", "serve"], "LOCK_DATABASE_URL"),
        ([PY, "-m", "railproxy"], "RAILPROXY_DATABASE_URL"),
        ([PY, "worker_main.py"], "WORKER_DATABASE_URL"),
        ([PAYOUTS, "outbox", "run"], "OUTBOX_DATABASE_URL"),
    ],
)
def test_each_component_refuses_to_start_with_an_unverified_dsn(
    argv: list[str], variable: str
) -> None:
    """The real entry points, before anything starts: one line naming the variable, exit 2."""
    result = _entry(argv, {variable: "postgresql://u@db.example.internal:5432/payouts"})
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert f"{variable} reaches db.example.internal with no sslmode" in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["payout", "list"],
        ["reconcile", "run"],
        ["check-invariants"],
        ["db", "migrate"],
    ],
)
def test_operator_commands_refuse_an_unverified_dsn_before_connecting(argv: list[str]) -> None:
    """The operator's commands read their DSN through one function (payouts.settings) and refuse
    as the components do: exit 2, the source named, nothing connected (the host does not exist,
    so a command that tried would have failed otherwise)."""
    result = _entry(
        [PAYOUTS, *argv, "--database-url", "postgresql://u@db.example.internal/payouts"], {}
    )
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "--database-url reaches db.example.internal with no sslmode" in result.stderr
