"""Start-up settings of the rail stub (env prefix `RAILSTUB_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from common.tls import ServerTLS
from railstub.behaviour import Behaviour


class StubSettings(ServerTLS, BaseSettings, Behaviour):
    """Every `Behaviour` field (e.g. `RAILSTUB_AMBIGUITY_RATE`, `RAILSTUB_RULES` as JSON), plus:"""

    model_config = SettingsConfigDict(env_prefix="RAILSTUB_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8710
    #: Seeds the generator behind every random choice, so a run is reproducible.
    seed: int = 0
    log_level: str = "INFO"
    #: The durable movement log (SQLite, `RAILSTUB_MOVEMENTS_PATH`): a restarted stub on the same
    #: file knows every movement. Unset: an in-memory log that lives as long as the process.
    movements_path: Path | None = None
    #: The accepted bearer tokens (common.credentials, `RAILSTUB_CREDENTIALS_PATH`): the rail
    #: authenticates its client (the rail proxy), the readers of its movement log (reconciler,
    #: invariant checker) and operators. `python -m railstub` refuses to start without it.
    credentials_path: Path | None = None

    def behaviour(self) -> Behaviour:
        return Behaviour.model_validate(self.model_dump(include=set(Behaviour.model_fields)))
