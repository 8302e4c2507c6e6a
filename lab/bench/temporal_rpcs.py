"""What the workers ask of the Temporal dev server, counted from its own /metrics: the
benchmarks charge Temporal's CPU to the RPCs behind it (heartbeats, task completions, polls)
and to its visibility writes (search-attribute upserts, starts, closes).

Why from the server: the SDK throttles heartbeats and batches nothing else, so only the server
knows how many calls arrived. Figures only; an unreachable /metrics reads as no calls.
"""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: The frontend's calls from clients and workers, the visibility store's writes and every
#: service's calls to the main store (SQLite on the dev server); None: any service.
_COUNTERS: dict[str, tuple[str | None, str]] = {
    "service_requests": ("frontend", "rpc"),
    "visibility_persistence_requests": ("history", "visibility"),
    "persistence_requests": (None, "persistence"),
}
#: Polls are long-polls: their count says how idle the pollers were, not what the work cost.
_IGNORED = {"PollWorkflowTaskQueue", "PollActivityTaskQueue", "PollNexusTaskQueue"}


def parse(text: str) -> dict[str, float]:
    """`rpc.<operation>` (frontend calls in the default namespace), `visibility.<operation>` and
    `persistence.<operation>` counters of one /metrics page."""
    out: dict[str, float] = {}
    # By family name: the parser names a counter's samples `<family>_total`.
    samples = (
        (family.name, sample)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
    for name, sample in samples:
        if name not in _COUNTERS:
            continue
        service, prefix = _COUNTERS[name]
        labels = sample.labels
        if (service and labels.get("service_name") != service) or labels.get(
            "operation"
        ) in _IGNORED:
            continue
        if prefix == "rpc" and labels.get("namespace") != "default":
            continue
        key = f"{prefix}.{labels.get('operation', '?')}"
        out[key] = out.get(key, 0.0) + float(sample.value)
    return out


async def scrape(port: int | None) -> dict[str, float]:
    """The counters of the dev server whose /metrics listens on `port` (empty if unreachable)."""
    if port is None:
        return {}
    try:
        async with httpx.AsyncClient(timeout=5.0) as http:
            r = await http.get(f"http://127.0.0.1:{port}/metrics")
            r.raise_for_status()
    except httpx.HTTPError:
        return {}
    return parse(r.text)


async def settled(
    port: int | None, every_s: float = 1.0, at_most_s: float = 15.0
) -> dict[str, float]:
    """The counters once two scrapes `every_s` apart agree on every frontend call: the server
    exports its counters on a reporting interval, so a scrape right after the work misses its
    tail (at most `at_most_s` of waiting; visibility writes may still trail, they are queued)."""
    last = await scrape(port)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + at_most_s
    while loop.time() < deadline:
        await asyncio.sleep(every_s)
        now = await scrape(port)
        if _rpcs(now) == _rpcs(last):
            return now
        last = now
    return last


def _rpcs(counters: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in counters.items() if k.startswith("rpc.")}


def per_item(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """Calls per item of each counter that moved between two scrapes."""
    keys = sorted(set(before) | set(after))
    deltas = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in keys}
    return {k: round(v / max(1, n), 2) for k, v in deltas.items() if v > 0}
