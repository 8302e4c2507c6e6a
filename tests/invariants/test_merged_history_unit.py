"""Unit tests of merged_grant_source (the history of every backend that issued grants, issue 25):
with fake sources standing for the PostgreSQL table and the lock server on etcd after a backend
switch. Each clean case has its negative control beside it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from invariants.checker import InvariantSettings, history_kinds, merged_grant_source
from invariants.errors import GrantSourceUnavailable
from invariants.evidence import GrantFact, GrantHistory
from invariants.rules import Evidence, check
from invariants.sources import GrantSource
from tests.invariants.test_rules_unit import at, grant, write


def source(grants: Sequence[GrantFact], since: float | None = None) -> GrantSource:
    async def fetch() -> Sequence[GrantFact]:
        out = GrantHistory(grants)
        out.complete_since = None if since is None else at(since)
        return out

    return fetch


def failing() -> GrantSource:
    async def fetch() -> Sequence[GrantFact]:
        raise GrantSourceUnavailable("lock server unreachable")

    return fetch


#: PostgreSQL's grants before the switch, etcd's after it (epoch-bumped tokens, far higher).
POSTGRES = [grant(1, 0, 5), grant(2, 5, 10)]
ETCD = [grant(2**40 + 7, 20, 25)]
WRITES = [write(1, 1, 1), write(2, 2, 6), write(3, 2**40 + 7, 21, to_state="RAIL_SUBMITTED")]


def inv07(grants: Sequence[GrantFact], since: object = None) -> list[str]:
    ev = Evidence(writes=list(WRITES), grants=list(grants))
    ev.grants_complete_since = since  # type: ignore[assignment]
    return check(ev)["INV-07"]


async def test_either_backends_history_alone_makes_the_others_writes_violations() -> None:
    """The defect of issue 25: the table alone misses etcd's grants, the server alone the
    table's; merged, every write has its grant."""
    assert inv07(await source(POSTGRES)()) == ["audit#3 claim token=1099511627783 without grant"]
    assert len(inv07(await source(ETCD)())) == 2
    merged = await merged_grant_source([source(POSTGRES), source(ETCD)])()
    assert inv07(merged) == []
    assert check(Evidence(grants=list(merged)))["INV-04"] == []  # tokens still increase per key


async def test_negative_control_a_token_no_backend_granted_is_still_a_violation() -> None:
    merged = await merged_grant_source([source(POSTGRES), source(ETCD[:0])])()
    assert inv07(merged) == ["audit#3 claim token=1099511627783 without grant"]


async def test_a_grant_in_both_sources_is_kept_once_as_the_first_gives_it() -> None:
    """The lock server on PostgreSQL answers from the same table: no duplicate, so no false
    INV-06 overlap of a grant with itself."""
    http_copy = [GrantFact(g.key, g.token, g.acquired_at, None, g.seq) for g in POSTGRES]
    merged = await merged_grant_source([source(POSTGRES), source(http_copy)])()
    assert [(g.token, g.ended_at) for g in merged] == [(1, at(5)), (2, at(10))]
    assert check(Evidence(grants=list(merged)))["INV-06"] == []
    # Negative control: concatenated without the merge, the copy overlaps its original.
    assert check(Evidence(grants=[*POSTGRES, *http_copy]))["INV-06"]


async def test_the_latest_horizon_wins_and_a_failing_source_fails_the_merge() -> None:
    merged = await merged_grant_source([source(POSTGRES), source(ETCD, since=15)])()
    assert getattr(merged, "complete_since", None) == at(15)
    with pytest.raises(GrantSourceUnavailable):
        await merged_grant_source([source(POSTGRES), failing()])()
    with pytest.raises(ValueError):
        merged_grant_source([])


def test_history_setting_takes_one_or_both_kinds() -> None:
    assert history_kinds("postgres,http") == ["postgres", "http"]
    assert InvariantSettings(history="http").history == "http"
    for bad in ("etcd", "postgres,postgres", ""):
        with pytest.raises(ValueError):
            history_kinds(bad)
