"""Start-up settings of the finance ledger stand-in (env prefix `FINLEDGER_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ServerTLS
from finledger.faults import Faults


class FinledgerSettings(ServerTLS, BaseSettings, Faults):
    """Every `Faults` field (e.g. `FINLEDGER_LATENCY_S`, `FINLEDGER_RULES` as JSON), plus:"""

    model_config = SettingsConfigDict(env_prefix="FINLEDGER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8730
    log_level: str = "INFO"
    #: The accepted bearer tokens (common.credentials, `FINLEDGER_CREDENTIALS_PATH`): writes
    #: only from the outbox publisher, admin only for operators; `python -m finledger` refuses
    #: to start without it.
    credentials_path: str | None = None
    #: The durable book (SQLite, `FINLEDGER_BOOK_PATH`): a restarted ledger on the same file
    #: knows every record it booked and answers a redelivery `duplicate`. Unset: in memory, for
    #: the life of the process (tests).
    book_path: Path | None = None

    def faults(self) -> Faults:
        return Faults.model_validate(self.model_dump(include=set(Faults.model_fields)))
