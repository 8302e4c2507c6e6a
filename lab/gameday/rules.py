"""The alert rules as data: each alert's name, severity, summary, runbook_url and the series it
reads.

Owns: reading ops/prometheus/rules.yml (and thresholds.yml) for the game day's table, its check
that the shipped Prometheus configuration scrapes what every alert reads, and the rule tests;
the names a PromQL expression reads (`expr_names`). Must never: write a rule file.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import yaml

from lab.gameday.prom import OPS_DIR, RULES

#: PromQL words that are not series names (functions, keywords, operators, label names of `le`).
_PROMQL = {
    "sum", "max", "min", "avg", "by", "without", "rate", "increase", "histogram_quantile",
    "time", "le", "on", "and", "or", "unless", "offset", "count", "round", "scalar", "vector",
    "group", "bool", "ignoring",
}  # fmt: skip

#: Raw series that no healthy stack has: each appears only once its fault happened (a labelled
#: counter or gauge has no sample before its first child). Every other series an alert reads
#: must be scraped from the first minute (the game day checks it after its warm-up).
FAULT_ONLY_SERIES = {
    "paydb_fenced_out_total": "a labelled counter: appears at the first fenced-out write",
    "railproxy_rejections_total": "a labelled counter: appears at the first rejection",
    "reconcile_discrepancies": "a labelled gauge: appears once a reconciliation run finished",
    "etcd_server_leader_changes_seen_total": "served by etcd only (the etcd lock backend)",
}


def expr_names(expr: str) -> set[str]:
    """The series (raw or recorded) a PromQL expression reads."""
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    expr = re.sub(r"\boffset\s+\d+[smhdwy]", "", expr)
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"(?<![\w:])\d+(\.\d+)?(e[+-]?\d+)?", "", expr)  # numbers
    expr = re.sub(r'"[^"]*"', "", expr)  # strings
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr)) - _PROMQL


@cache
def recording_rules() -> dict[str, str]:
    """Recorded series -> expression, of rules.yml and thresholds.yml."""
    out: dict[str, str] = {}
    for name in ("rules.yml", "thresholds.yml"):
        doc = yaml.safe_load((OPS_DIR / name).read_text())
        out |= {r["record"]: r["expr"] for g in doc["groups"] for r in g["rules"] if "record" in r}
    return out


def raw_series(expr: str) -> set[str]:
    """The scraped series an expression reads, through every recording rule it names."""
    recorded = recording_rules()
    out: set[str] = set()
    todo = list(expr_names(expr))
    while todo:
        name = todo.pop()
        if name in recorded:
            todo.extend(expr_names(recorded[name]) - out)
        elif name not in out:
            out.add(name)
    return out


def alert_series(alert: str) -> set[str]:
    """The scraped series `alert` reads (`up` is Prometheus's own, for every target); none for
    a name rules.yml does not have (a test's own control scenario)."""
    rule = alerts().get(alert)
    return raw_series(str(rule["expr"])) if rule else set()


@cache
def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def runbook_of(alert: str) -> str:
    return str(alerts()[alert]["annotations"]["runbook_url"])
