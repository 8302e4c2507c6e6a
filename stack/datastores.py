"""The local stack's embedded data stores: PostgreSQL (one server, or a primary and its standby)
and etcd (one or more members), as `stack.system.Stack` starts, restarts, fails over, signals
and stops them.

Owns: which embedded servers run, on which ports and with which certificates, and their pids and
logs. Must never: start a server on a port that is already taken, leave one running after
`stop`, or touch a server the stack did not start (DATABASE_URL, ETCD_ENDPOINTS).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.logs import get_logger
from stack.config import StackConfig, StackError, UnknownProcessError
from stack.embedded.etcd import EmbeddedEtcd, EtcdMember
from stack.embedded.postgres import EmbeddedPostgres, PostgresTLS
from stack.embedded.shared import EmbeddedServerError, free_port
from stack.pki import StackTLS
from stack.process import ProcessInfo, tcp_check
from stack.replication import ReplicatedPostgres
from stack.waiting import in_thread, wait_until

if TYPE_CHECKING:
    from lockservice.server import EtcdTLSFiles

__all__ = ["DataStores"]

log = get_logger("stack.system")


class DataStores:
    """The embedded PostgreSQL (or pair) and etcd cluster of one stack; empty until started."""

    def __init__(self, config: StackConfig, run_dir: Path, progress: Callable[[str], None]) -> None:
        self.config = config
        self.run_dir = run_dir
        self._progress = progress
        self.pg: EmbeddedPostgres | None = None
        #: The primary/standby pair when config.postgres_standby is set; pg is its primary.
        self.ha: ReplicatedPostgres | None = None
        self.etcd: EmbeddedEtcd | None = None

    # ------------------------------------------------------------------ PostgreSQL

    async def start_postgres(self, tls: StackTLS | None) -> str:
        """Start the embedded PostgreSQL (or pair) unless DATABASE_URL names one; its URL."""
        cfg = self.config
        pg_tls = tls.postgres() if tls else None
        if cfg.database_url:
            self._progress("PostgreSQL: using DATABASE_URL")
        elif cfg.postgres_standby != "none":
            await self._start_replicated(pg_tls)
        else:
            assert cfg.ports.postgres is not None
            # pgserver's build has no SSL: with TLS on, the server listens on its Unix socket
            # only and its TLS front (stack.pgtls) on the port; every DSN says verify-full.
            pg = EmbeddedPostgres(data_dir=self.run_dir / "pg", port=cfg.ports.postgres, tls=pg_tls)
            how = "behind its TLS front" if pg.tls else "plaintext"
            self._progress(
                f"starting embedded PostgreSQL on 127.0.0.1:{pg.port}, {how}"
                f" (log {pg.startup_log_path})"
            )
            self.pg = pg
            try:
                await in_thread(lambda: pg.start(timeout=cfg.health_timeout_s))
            except EmbeddedServerError as exc:
                raise StackError(f"embedded PostgreSQL failed: {exc}") from exc
        return cfg.database_url or (self.ha.url if self.ha else self.pg.url if self.pg else "")

    async def _start_replicated(self, tls: PostgresTLS | None) -> None:
        cfg = self.config
        assert cfg.ports.postgres is not None
        ha = ReplicatedPostgres(
            base_dir=self.run_dir / "pg-ha",
            synchronous=cfg.postgres_standby == "sync",
            tls=tls,
        )
        ha.primary.port = cfg.ports.postgres  # the standby takes a free port
        self._progress(
            f"starting embedded PostgreSQL on 127.0.0.1:{ha.primary.port} with a"
            f" {cfg.postgres_standby} standby on 127.0.0.1:{ha.standby.port}"
        )
        self.ha, self.pg = ha, ha.primary
        try:
            await in_thread(lambda: ha.start(timeout=cfg.health_timeout_s))
        except EmbeddedServerError as exc:
            raise StackError(f"embedded PostgreSQL pair failed: {exc}") from exc

    async def db_failover(self) -> dict[str, Any]:
        """SIGKILL the PostgreSQL primary and promote its standby (chaos fault db_failover).
        Clients keep the multi-host DSN and reconnect to the promoted node."""
        ha = self.ha
        if ha is None:
            raise UnknownProcessError("no PostgreSQL standby in this stack (postgres_standby)")
        old = ha.primary.port
        started = time.monotonic()
        await in_thread(ha.failover)
        self.pg = ha.primary
        took = round(time.monotonic() - started, 3)
        log.warning(
            "stack.db_failover",
            old_primary_port=old,
            new_primary_port=ha.primary.port,
            seconds=took,
        )
        return {"old_primary_port": old, "new_primary_port": ha.primary.port, "took_s": took}

    def postgres_pid(self) -> int | None:
        if self.pg is None:
            return None
        try:
            return int((self.pg.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def kill_postgres(self, sig: int) -> None:
        pid = self.postgres_pid()
        if pid is None:
            raise UnknownProcessError("postgres is not running embedded (DATABASE_URL is set)")
        os.kill(pid, sig)

    async def restart_postgres(self) -> None:
        pg = self.pg
        if pg is None:
            raise UnknownProcessError("postgres is external (DATABASE_URL); cannot restart")
        with contextlib.suppress(EmbeddedServerError):
            await in_thread(lambda: pg.stop("fast"))
        await in_thread(pg.start)

    # ------------------------------------------------------------------ etcd

    async def start_etcd(self, tls: StackTLS | None) -> tuple[str, ...]:
        """Start the embedded etcd cluster unless ETCD_ENDPOINTS names one; its endpoints."""
        cfg = self.config
        if cfg.etcd_endpoints:
            self._progress("etcd: using ETCD_ENDPOINTS")
            return cfg.etcd_endpoints
        assert cfg.ports.etcd is not None
        if cfg.etcd_members < 1:
            raise StackError(f"etcd_members must be at least 1, got {cfg.etcd_members}")
        base = self.run_dir / "etcd"
        # Member m0 keeps the configured client port (PAYOUTS_ETCD_PORT); the others take free ones.
        members = [
            EtcdMember(
                name=f"m{i}",
                data_dir=base / f"m{i}",
                client_port=cfg.ports.etcd if i == 0 else free_port(),
                tls=tls.etcd_member(f"m{i}") if tls else None,
            )
            for i in range(cfg.etcd_members)
        ]
        etcd = EmbeddedEtcd(base_dir=base, members=members)
        ports = ", ".join(str(m.client_port) for m in members)
        how = "mutual TLS" if tls else "plaintext"
        self._progress(
            f"starting embedded etcd ({len(members)} member(s), {how}) on 127.0.0.1:{ports}"
        )
        self.etcd = etcd
        try:
            await in_thread(lambda: etcd.start(timeout=cfg.health_timeout_s))
        except EmbeddedServerError as exc:
            raise StackError(f"{exc}; see its logs in {base}") from exc
        for m in members:
            await wait_until(
                tcp_check(m.client_port), cfg.health_timeout_s, f"embedded etcd {m.name}"
            )
        return tuple(etcd.endpoints)

    @property
    def etcd_member_names(self) -> list[str]:
        """Names of the embedded etcd members (empty when etcd is external or not used)."""
        return [m.name for m in self.etcd.members] if self.etcd is not None else []

    async def etcd_leader(self, client_tls: EtcdTLSFiles | None, timeout_s: float) -> str | None:
        """The name of the member that is the raft leader right now, asked of every live member;
        None while there is no leader (an election is running) or no member answers."""
        from lockservice.server import etcd_client

        if self.etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        for m in self.etcd.members:
            if m.proc is None or m.proc.poll() is not None:
                continue
            try:
                async with etcd_client([m.endpoint], client_tls) as client:
                    status = await asyncio.wait_for(client.status(), timeout_s)
            except Exception:  # noqa: S112 - any failure means "this member cannot tell"
                continue
            if status.leader is not None:
                return str(status.leader.name)
        return None

    async def stop_etcd_member(self, name: str, sig: int) -> None:
        member, etcd = self._named_etcd_member(name)
        await in_thread(lambda: etcd.stop_member(member, sig))

    async def start_etcd_member(self, name: str) -> None:
        member, etcd = self._named_etcd_member(name)
        await in_thread(lambda: etcd.start_member(member, self.config.health_timeout_s))

    def kill_etcd(self, sig: int) -> None:
        member = self._first_etcd_member()
        if member.proc is not None:
            member.proc.send_signal(sig)

    async def restart_etcd(self) -> None:
        member, etcd = self._first_etcd_member(), self.etcd
        assert etcd is not None
        await in_thread(lambda: etcd.stop_member(member))
        await in_thread(lambda: etcd.start_member(member))

    def _named_etcd_member(self, name: str) -> tuple[EtcdMember, EmbeddedEtcd]:
        if self.etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        for m in self.etcd.members:
            if m.name == name:
                return m, self.etcd
        raise UnknownProcessError(f"no etcd member named {name!r}; have {self.etcd_member_names}")

    def _first_etcd_member(self) -> EtcdMember:
        if self.etcd is None:
            raise UnknownProcessError("etcd is not running embedded (ETCD_ENDPOINTS or postgres)")
        return self.etcd.members[0]

    # ------------------------------------------------------------------ all of them

    def processes(self) -> dict[str, ProcessInfo]:
        """Every running embedded server (and PostgreSQL's TLS fronts) by name."""
        out: dict[str, ProcessInfo] = {}
        pg_pid = self.postgres_pid()
        if self.pg is not None and pg_pid is not None:
            out["postgres"] = ProcessInfo("postgres", pg_pid, self.pg.log_path, self.pg.url)
        standby_pid = self.ha.standby_pid() if self.ha is not None else None
        if self.ha is not None and standby_pid is not None:
            sb = self.ha.standby
            out["postgres-standby"] = ProcessInfo(
                "postgres-standby", standby_pid, sb.log_path, sb.url
            )
        # The TLS fronts (stack.pgtls): their own processes, whose CPU the benches charge apart.
        nodes = [("postgres", self.pg)]
        if self.ha is not None:
            nodes.append(("postgres-standby", self.ha.standby))
        for name, node in nodes:
            front = node.front_pid if node is not None else None
            if node is not None and front is not None:
                out[f"{name}-tls"] = ProcessInfo(f"{name}-tls", front, node.front_log_path)
        if self.etcd is not None:
            for i, m in enumerate(self.etcd.members):
                if m.proc is not None and m.proc.poll() is None:
                    # Member 0 keeps the name "etcd" (one-member stacks, leftover detection).
                    name = "etcd" if i == 0 else f"etcd-{m.name}"
                    out[name] = ProcessInfo(name, m.proc.pid, m.log_path, m.client_url)
        return out

    async def stop(self) -> list[str]:
        """Stop etcd, then PostgreSQL (the pair, or the one server: fast, else immediate);
        returns what failed."""
        errors: list[str] = []
        if self.etcd is not None:
            etcd, self.etcd = self.etcd, None
            await in_thread(etcd.stop)
        if self.ha is not None:
            ha, self.ha, self.pg = self.ha, None, None
            await in_thread(ha.stop)
        if self.pg is not None:
            pg, self.pg = self.pg, None
            try:
                await in_thread(lambda: pg.stop("fast"))
            except EmbeddedServerError as exc:
                errors.append(str(exc))
                with contextlib.suppress(EmbeddedServerError):
                    await in_thread(lambda: pg.stop("immediate"))
        return errors
