"""`python -m railproxy`: serve the rail proxy with uvicorn (settings from RAILPROXY_* env)."""

from __future__ import annotations

import uvicorn

from payouts.logs import configure_logging
from railproxy.app import create_app
from railproxy.settings import ProxySettings


def main() -> None:
    settings = ProxySettings()
    configure_logging("railproxy", level=settings.log_level)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level="warning")


if __name__ == "__main__":
    main()
