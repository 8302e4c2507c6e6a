"""UNIT tests of the wake-up rule of the PostgreSQL backend's blocked acquirers
(lockservice.server.backends.wakeups): one NOTIFY wakes one waiter, the longest-waiting one not
awake already, and a waiter leaving after a wake-up it may have used up hands one on. The same
rule against real PostgreSQL: tests/lockservice/test_postgres_handoff.py.
"""

from __future__ import annotations

from lockservice.server.backends.wakeups import Wakeups


def _awake(*events: object) -> list[bool]:
    return [e.is_set() for e in events]  # type: ignore[attr-defined]


def test_unit_a_notify_wakes_only_the_longest_waiting() -> None:
    w = Wakeups()
    first, second, third = w.join("k"), w.join("k"), w.join("k")
    w.notify("k")
    assert _awake(first, second, third) == [True, False, False]


def test_unit_a_second_notify_wakes_the_next_while_the_first_is_still_awake() -> None:
    """Two NOTIFYs before the first woken waiter ran: two waiters attempt, never one."""
    w = Wakeups()
    first, second, third = w.join("k"), w.join("k"), w.join("k")
    w.notify("k")
    w.notify("k")
    assert _awake(first, second, third) == [True, True, False]


def test_unit_a_waiter_that_cleared_its_event_to_attempt_is_woken_again() -> None:
    """A NOTIFY during an attempt (the event cleared before it) wakes that waiter again: it
    attempts once more after the NOTIFY, and it is still the longest-waiting one."""
    w = Wakeups()
    first, second = w.join("k"), w.join("k")
    w.notify("k")
    first.clear()  # what the backend does just before the attempt
    w.notify("k")
    assert _awake(first, second) == [True, False]


def test_unit_keys_do_not_wake_each_other() -> None:
    w = Wakeups()
    a, b = w.join("a"), w.join("b")
    w.notify("a")
    w.notify("nobody-waits")
    assert _awake(a, b) == [True, False]


def test_unit_leaving_with_a_used_up_wake_up_hands_it_on() -> None:
    w = Wakeups()
    first, second = w.join("k"), w.join("k")
    w.notify("k")
    w.leave("k", first, hand_on=True)  # woken, then cancelled or failed before it could win
    assert second.is_set() and w.count("k") == 1


def test_unit_leaving_with_a_grant_or_no_wake_up_hands_nothing_on() -> None:
    """Control of the test above: the same leave without `hand_on` wakes nobody."""
    w = Wakeups()
    first, second = w.join("k"), w.join("k")
    w.notify("k")
    w.leave("k", first, hand_on=False)
    assert not second.is_set() and w.count("k") == 1
    w.leave("k", second, hand_on=True)  # the last one: nobody to hand to, the key is forgotten
    assert w.count("k") == 0


def test_unit_wake_all_is_the_other_side_of_the_ab() -> None:
    """LOCK_PG_WAKE=all (the A/B's other side, as before issue 29): every waiter per NOTIFY."""
    w = Wakeups(wake_all=True)
    events = [w.join("k") for _ in range(3)]
    w.notify("k")
    assert _awake(*events) == [True, True, True]
