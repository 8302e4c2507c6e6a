"""`python -m railstub`: serve the rail stub with uvicorn (settings from RAILSTUB_* env)."""

from __future__ import annotations

import uvicorn

from payouts.logs import configure_logging
from railstub.app import create_app
from railstub.settings import StubSettings


def main() -> None:
    settings = StubSettings()
    configure_logging("railstub", level=settings.log_level)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
