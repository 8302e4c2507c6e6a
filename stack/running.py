"""What the state files read from a running local stack: `RunningStack`, the part of
`stack.system.Stack` that `stack.statefile`, `stack.envfile`, `stack.endpoints` and
`stack.promconfig` see.

Why a Protocol and not `Stack` itself: `Stack` imports those modules to write its state, so their
annotating with `Stack` closed a circle of imports (even if only for the type checker). They read
a running stack's addresses, credentials and processes; this is that face, and mypy checks that
`Stack` has it wherever `Stack` is passed. Owns: nothing at run time. Must never: import
`stack.system`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lockservice.server import EtcdTLSFiles
    from stack.config import StackConfig
    from stack.credentials import StackCredentials
    from stack.launcher import Launcher
    from stack.process import ProcessInfo
    from stack.service_env import Addresses

__all__ = ["RunningStack"]


class RunningStack(Protocol):
    """A running local stack as its state files, env file and scrape targets read it."""

    @property
    def config(self) -> StackConfig: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def addresses(self) -> Addresses | None: ...
    @property
    def launcher(self) -> Launcher: ...
    @property
    def credentials(self) -> StackCredentials: ...
    @property
    def env_file(self) -> Path: ...
    @property
    def processes(self) -> dict[str, ProcessInfo]: ...
    @property
    def workers(self) -> list[str]: ...
    @property
    def database_url(self) -> str: ...
    @property
    def role_urls(self) -> dict[str, str]: ...
    @property
    def pgpass_file(self) -> Path: ...
    @property
    def temporal_address(self) -> str: ...
    @property
    def ui_url(self) -> str: ...
    @property
    def lock_url(self) -> str: ...
    @property
    def railstub_url(self) -> str: ...
    @property
    def railproxy_url(self) -> str: ...
    @property
    def finledger_url(self) -> str | None: ...
    @property
    def etcd_endpoints(self) -> tuple[str, ...]: ...
    @property
    def tls_ca_file(self) -> Path | None: ...
    def etcd_client_tls(self) -> EtcdTLSFiles | None: ...
