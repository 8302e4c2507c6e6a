"""`python -m finledger`: serve the finance ledger stand-in (settings from FINLEDGER_* env)."""

from __future__ import annotations

from common.credentials import refuse_without
from common.exiting import load_settings
from common.launcher import serve
from finledger.app import create_app
from finledger.settings import FinledgerSettings


def main() -> None:
    settings = load_settings("finledger", FinledgerSettings)
    refuse_without(settings.credentials_path, "FINLEDGER_CREDENTIALS_PATH", "finledger")
    serve(
        lambda: create_app(settings),
        service="finledger",
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        tls=settings.uvicorn_ssl(),
    )


if __name__ == "__main__":
    main()
