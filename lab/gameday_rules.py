"""The alert rules as data: each alert's name, severity, summary and runbook_url.

Owns: reading ops/prometheus/rules.yml for the game day's table and the rule tests. Must never:
write a rule file.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import yaml

from lab.gameday_prom import RULES


@cache
def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def runbook_of(alert: str) -> str:
    return str(alerts()[alert]["annotations"]["runbook_url"])
