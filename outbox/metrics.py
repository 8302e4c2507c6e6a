"""Prometheus metrics of the outbox publisher. No label carries an id, key, account or payout
(NFR-09): the only label is the outcome, a closed set."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from outbox.delivery import Outcome


class OutboxMetrics:
    """One registry per publisher instance, so several publishers can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.deliveries = Counter(
            "outbox_deliveries", "Delivery attempts by outcome", ["outcome"], registry=r
        )
        for outcome in Outcome:
            self.deliveries.labels(outcome=str(outcome))  # export zeros from the start
        self.backlog = Gauge("outbox_backlog_depth", "Rows pending delivery", registry=r)
        self.oldest_age = Gauge(
            "outbox_oldest_undelivered_age_seconds",
            "Age of the oldest pending row (0 when none)",
            registry=r,
        )
        self.dead_letters = Gauge(
            "outbox_dead_letters", "Rows in delivery_failed (dead letter)", registry=r
        )
        self.conflict_blocked = Gauge(
            "outbox_conflict_blocked", "Rows held for an operator after a 409", registry=r
        )

    def observe_summary(self, summary: dict[str, Any]) -> None:
        self.backlog.set(summary["pending"])
        self.oldest_age.set(summary["oldest_undelivered_age_s"] or 0.0)
        self.dead_letters.set(summary["delivery_failed"])
        self.conflict_blocked.set(summary["conflict_blocked"])
