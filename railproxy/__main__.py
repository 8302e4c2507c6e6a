"""`python -m railproxy`: serve the rail proxy with uvicorn (settings from RAILPROXY_* env)."""

from __future__ import annotations

import asyncio

from common.credentials import refuse_without
from common.exiting import load_settings, refuse
from common.launcher import serve
from railproxy.app import create_app
from railproxy.errors import StartupRefused
from railproxy.settings import ProxySettings
from railproxy.startup import check_start


def main() -> None:
    settings = load_settings("railproxy", ProxySettings)
    refuse_without(settings.credentials_path, "RAILPROXY_CREDENTIALS_PATH", "railproxy")
    # Checked here first, before logging is configured, for a clean refusal (one line on stderr,
    # exit 2, nothing started); the app's lifespan checks again, so that any other way of
    # serving the app is guarded too.
    try:
        asyncio.run(check_start(settings))
    except StartupRefused as exc:
        refuse("railproxy", str(exc))
    serve(
        lambda: create_app(settings),
        service="railproxy",
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        tls=settings.uvicorn_ssl(),
    )


if __name__ == "__main__":
    main()
