"""`python -m railstub`: serve the rail stub with uvicorn (settings from RAILSTUB_* env)."""

from __future__ import annotations

import uvicorn

from common.credentials import refuse_without
from common.logs import configure_logging
from railstub.app import create_app
from railstub.settings import StubSettings


def main() -> None:
    settings = StubSettings()
    refuse_without(settings.credentials_path, "RAILSTUB_CREDENTIALS_PATH", "railstub")
    configure_logging("railstub", level=settings.log_level)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
