"""The rail stub's tests use the session's stub server of the rail tests (tests/railproxy)."""

from tests.railproxy.conftest import stub, stub_server

__all__ = ["stub", "stub_server"]
