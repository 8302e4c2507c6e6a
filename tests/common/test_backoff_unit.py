"""common.backoff: the one full-jitter formula the retry loops sleep by (unit tests; the random
source is a stub that returns the top of the range, named as such, or a seeded Random)."""

from __future__ import annotations

import random

import pytest

from common.backoff import full_jitter


class TopOfRange(random.Random):
    """Stub: `uniform(a, b)` is always b, so a test reads the ceiling the formula chose."""

    def uniform(self, a: float, b: float) -> float:
        return b


def test_the_ceiling_doubles_per_exponent_until_the_cap() -> None:
    ceilings = [full_jitter(n, base_s=0.5, cap_s=5.0, rng=TopOfRange()) for n in range(6)]
    assert ceilings == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_negative_exponent_is_zero_and_a_huge_one_stays_at_the_cap() -> None:
    assert full_jitter(-3, base_s=0.2, rng=TopOfRange()) == 0.2
    assert full_jitter(10_000, base_s=0.2, cap_s=30.0, rng=TopOfRange()) == 30.0


@pytest.mark.parametrize("exponent", [0, 1, 4, 9])
def test_every_delay_lies_in_the_whole_interval(exponent: int) -> None:
    rng = random.Random(exponent)
    ceiling = min(8.0, 0.1 * 2**exponent)
    delays = [full_jitter(exponent, base_s=0.1, cap_s=8.0, rng=rng) for _ in range(2000)]
    assert all(0 <= d <= ceiling for d in delays)
    # Full jitter, not "ceiling minus a little": the lowest and the highest tenth are both used.
    assert min(delays) < ceiling / 10 and max(delays) > ceiling * 0.9
