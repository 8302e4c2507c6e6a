"""Full-jitter exponential backoff: the one formula every retry loop of ours sleeps by.

Owns: the delay before a retry. Must never: sleep, retry, or decide what is retryable: each
loop keeps its own end (the lock SDK's session, a rail slot's lease, an outbox row's next
attempt, a workflow's deadline) and its own idea of a retryable error.

Written here rather than taken from tenacity (not a dependency, and its `wait_random_exponential`
wants a `RetryCallState` that none of these loops has): the formula is one line, and the four
loops had four copies of it, each with its own off-by-one. Full jitter (AWS Architecture Blog,
"Exponential Backoff And Jitter"): retries of many callers spread over the whole interval, so
they never herd.
"""

from __future__ import annotations

import math
import random

#: 2**62 times any base is past every cap: larger exponents change nothing and would overflow.
_MAX_EXPONENT = 62


def full_jitter(
    exponent: int, *, base_s: float, cap_s: float = math.inf, rng: random.Random
) -> float:
    """Uniform in [0, min(cap_s, base_s * 2**exponent)] seconds; a negative exponent counts
    as 0."""
    return rng.uniform(0, min(cap_s, base_s * 2 ** min(max(exponent, 0), _MAX_EXPONENT)))
