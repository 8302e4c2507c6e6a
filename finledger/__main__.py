"""`python -m finledger`: serve the finance ledger stand-in (settings from FINLEDGER_* env)."""

from __future__ import annotations

import uvicorn

from common.credentials import refuse_without
from common.logs import configure_logging
from finledger.app import create_app
from finledger.settings import FinledgerSettings


def main() -> None:
    settings = FinledgerSettings()
    refuse_without(settings.credentials_path, "FINLEDGER_CREDENTIALS_PATH", "finledger")
    configure_logging("finledger", level=settings.log_level)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
