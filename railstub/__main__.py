"""`python -m railstub`: serve the rail stub with uvicorn (settings from RAILSTUB_* env)."""

from __future__ import annotations

from common.credentials import refuse_without
from common.exiting import load_settings
from common.launcher import serve
from railstub.app import create_app
from railstub.settings import StubSettings


def main() -> None:
    settings = load_settings("railstub", StubSettings)
    refuse_without(settings.credentials_path, "RAILSTUB_CREDENTIALS_PATH", "railstub")
    serve(
        lambda: create_app(settings),
        service="railstub",
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        tls=settings.uvicorn_ssl(),
    )


if __name__ == "__main__":
    main()
