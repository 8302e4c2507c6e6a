"""A database outage on a real PostgreSQL, for the outage contract's tests (common.outage): every
connection to one database is terminated (pg_terminate_backend) and new ones are refused while
it lasts (CONNECTION LIMIT 0: SQLSTATE 53300 for the services' own, non-superuser roles), which
is what a service sees while its database restarts or is overloaded."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import asyncpg

_OTHERS = "datname = $1 AND pid <> pg_backend_pid()"


@contextlib.asynccontextmanager
async def database_down(admin_url: str, database_url: str) -> AsyncIterator[None]:
    """For the block: `database_url`'s database has no connection and takes none. `admin_url`
    is a superuser's, on another database of the same server (the limit does not stop it)."""
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(admin_url)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" CONNECTION LIMIT 0')
        try:
            await admin.execute(
                f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {_OTHERS}", name
            )
            # pg_terminate_backend only signals: wait until every backend has actually gone, so
            # that no query of the block can still run on one.
            for _ in range(1000):  # a failure detector's bound, not a timing assertion
                if not await admin.fetchval(
                    f"SELECT count(*) FROM pg_stat_activity WHERE {_OTHERS}", name
                ):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError(f"the backends of {name} did not exit")
            yield
        finally:
            await admin.execute(f'ALTER DATABASE "{name}" CONNECTION LIMIT -1')
    finally:
        await admin.close()
