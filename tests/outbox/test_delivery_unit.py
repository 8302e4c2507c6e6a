"""Unit tests of the pure delivery logic: answer classification, backoff bounds, settings."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from outbox.delivery import OutboxSettings, Outcome, backoff_delay, classify_status


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (201, Outcome.COMPLETED),
        (200, Outcome.DUPLICATE_COMPLETED),
        (409, Outcome.CONFLICT_BLOCKED),
        (404, Outcome.PERMANENT_FAILURE),
        (422, Outcome.PERMANENT_FAILURE),
        (400, Outcome.PERMANENT_FAILURE),
        (429, Outcome.RETRYABLE_FAILURE),
        (408, Outcome.RETRYABLE_FAILURE),
        (500, Outcome.RETRYABLE_FAILURE),
        (503, Outcome.RETRYABLE_FAILURE),
    ],
)
def test_classify_status(code: int, outcome: Outcome) -> None:
    """Each ledger answer maps to the outbox's outcome vocabulary (404 is permanent)."""
    assert classify_status(code) is outcome


@given(
    attempt=st.integers(min_value=1, max_value=200),
    base=st.floats(min_value=0.001, max_value=10),
    cap=st.floats(min_value=10, max_value=1000),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_backoff_is_bounded_full_jitter(attempt: int, base: float, cap: float, seed: int) -> None:
    """The delay is in [0, min(cap, base * 2^(attempt-1))], never above the cap."""
    d = backoff_delay(attempt, base_s=base, cap_s=cap, rng=random.Random(seed))
    assert 0 <= d <= min(cap, base * 2 ** min(attempt - 1, 62))


def test_backoff_grows_exponentially() -> None:
    """The ceiling doubles per attempt until the cap (a fixed draw of 1.0 shows the ceiling)."""

    class Top(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b

    ceilings = [backoff_delay(n, base_s=1, cap_s=10, rng=Top()) for n in range(1, 7)]
    assert ceilings == [1, 2, 4, 8, 10, 10]


def test_settings_reject_incoherent_values() -> None:
    """A lease shorter than two HTTP timeouts, or a cap below the base delay, is refused."""
    with pytest.raises(ValidationError):
        OutboxSettings(http_timeout_s=10, lease_s=15)
    with pytest.raises(ValidationError):
        OutboxSettings(base_delay_s=5, max_delay_s=1)
    assert OutboxSettings(http_timeout_s=1, lease_s=2).lease_s == 2


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Base delay, cap and maximum attempts come from OUTBOX_* variables."""
    monkeypatch.setenv("OUTBOX_BASE_DELAY_S", "0.5")
    monkeypatch.setenv("OUTBOX_MAX_DELAY_S", "7")
    monkeypatch.setenv("OUTBOX_MAX_ATTEMPTS", "3")
    s = OutboxSettings()
    assert (s.base_delay_s, s.max_delay_s, s.max_attempts) == (0.5, 7, 3)
