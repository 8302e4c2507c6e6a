"""Which environment variables each deployable component reads, derived from the code.

Owns: the map from a deployed component (a docker-compose service, a Kubernetes workload) to the
settings classes and command modules of the code it runs, and the variable names read from them.
Must never: list a variable by hand. Names come from the pydantic-settings classes (prefix +
field name, or the field's validation aliases) and from literal `os.environ.get("X")`,
`os.environ["X"]` and `os.getenv("X")` calls in the command modules, and from the commands' DSN
look-ups `database_url(args, "X_DATABASE_URL")` (payouts.settings: X, then its DATABASE_URL
fallback), so a variable added to the code (another role's DSN, a bearer credential) shows up
here with no change to this file.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from dataclasses import dataclass, field

from pydantic import AliasChoices
from pydantic_settings import BaseSettings

from common import temporal_tls


@dataclass(frozen=True)
class Component:
    name: str  # as docs/architecture.md (Processes) and deployments do
    command: tuple[str, ...]  # the container command that runs it
    settings: tuple[str, ...] = ()  # "module:Class" of each pydantic-settings class it builds
    modules: tuple[str, ...] = ()  # modules whose literal environment reads count too
    one_shot: bool = False
    extra: frozenset[str] = field(default_factory=frozenset)


#: What a process that connects to Temporal's frontend reads for its TLS (common.temporal_tls
#: reads them from a mapping, which the literal scan below cannot see).
TEMPORAL_CLIENT = frozenset(temporal_tls.VARIABLES)


#: Every component the image runs. Temporal, PostgreSQL and etcd are third-party images.
COMPONENTS: tuple[Component, ...] = (
    Component(
        "lock-server",
        ("python", "-m", "lockservice", "serve"),
        settings=("lockservice.server.settings:LockSettings",),
    ),
    Component(
        "railstub", ("python", "-m", "railstub"), settings=("railstub.settings:StubSettings",)
    ),
    Component(
        "railproxy", ("python", "-m", "railproxy"), settings=("railproxy.settings:ProxySettings",)
    ),
    Component(
        "finledger",
        ("python", "-m", "finledger"),
        settings=("finledger.settings:FinledgerSettings",),
    ),
    Component(
        "outbox",
        ("payouts", "outbox", "run"),
        settings=("outbox.delivery:OutboxSettings",),
        modules=("payouts.cli", "payouts.outbox_cli"),
    ),
    Component(
        "worker",
        ("python", "/app/worker_main.py"),
        settings=("worker.settings:WorkerSettings",),
        extra=TEMPORAL_CLIENT,
    ),
    Component("migrate", ("payouts", "db", "migrate"), modules=("payouts.cli",), one_shot=True),
    Component(
        "reconcile-schedule",
        ("payouts", "reconcile", "schedule", "--every", "1h"),
        settings=("reconcile.reconciler:ReconcileSettings",),
        modules=("payouts.reconcile_cli",),
        one_shot=True,
        extra=TEMPORAL_CLIENT,
    ),
    Component(
        "reconciler",
        ("payouts", "reconcile", "run", "--json"),
        settings=("reconcile.reconciler:ReconcileSettings",),
        modules=("payouts.cli", "payouts.reconcile_cli"),
        one_shot=True,
    ),
    Component(
        "invariants",
        ("payouts", "check-invariants", "--json"),
        settings=("invariants.checker:InvariantSettings",),
        modules=("payouts.cli", "payouts.invariants_cli", "payouts.settings"),
        one_shot=True,
        extra=TEMPORAL_CLIENT,  # its workflow source (invariants.sources)
    ),
)

#: Read by the image itself (its HEALTHCHECK, common.healthcheck: the URL and the CA of an https
#: one), by every process's tracing
#: (common.tracing: the collector's address, the CA that verifies it, and the standard switch),
#: or by every HTTPS client's default trust (httpx and Python's ssl: SSL_CERT_FILE, what the
#: operator commands without a `<PREFIX>_TLS_CA_FILE` of their own verify against; docs/security.md),
#: valid in every service.
IMAGE_VARIABLES = frozenset(
    {
        "HEALTHCHECK_URL",
        "HEALTHCHECK_CA_FILE",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
        "OTEL_SDK_DISABLED",
        "SSL_CERT_FILE",
    }
)


def settings_variables(cls: type[BaseSettings]) -> set[str]:
    """The environment names a pydantic-settings class reads (upper case)."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    names: set[str] = set()
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices):
            names.update(str(choice).upper() for choice in alias.choices)
        elif isinstance(alias, str):
            names.add(alias.upper())
        else:
            names.add(f"{prefix}{name}".upper())
    return names


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


#: payouts.settings.database_url(args, *own_vars): reads each of own_vars, then this fallback.
DSN_HELPER = "database_url"
DSN_FALLBACK = "DATABASE_URL"


def _dsn_lookup(node: ast.AST) -> set[str]:
    """The variables a `database_url(args, "X", ...)` call reads; empty for any other node."""
    if not isinstance(node, ast.Call):
        return set()
    func = node.func
    name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
    if name != DSN_HELPER:
        return set()
    own = {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return own | {DSN_FALLBACK}


def literal_environment_reads(module_name: str) -> set[str]:
    """`os.environ.get("X")`, `os.environ["X"]`, `os.getenv("X")` with a literal name, and the
    variables of each `database_url(args, "X")` DSN look-up."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    names: set[str] = set()
    for node in ast.walk(tree):
        names |= _dsn_lookup(node)
        arg: ast.expr | None = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = node.func
            if (func.attr == "get" and _is_environ(func.value)) or func.attr == "getenv":
                arg = node.args[0]
        elif isinstance(node, ast.Subscript) and _is_environ(node.value):
            arg = node.slice
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            names.add(arg.value)
    return names


def variables(component: Component) -> set[str]:
    """Every variable the component's code reads."""
    names: set[str] = set(component.extra)
    for spec in component.settings:
        module, _, cls_name = spec.partition(":")
        names |= settings_variables(getattr(importlib.import_module(module), cls_name))
    for module in component.modules:
        names |= literal_environment_reads(module)
    return names


def by_name() -> dict[str, Component]:
    return {c.name: c for c in COMPONENTS}
