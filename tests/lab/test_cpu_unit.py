"""lab.bench.cpu: the /proc readers the benchmarks charge CPU with."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from lab.bench.cpu import per_item_ms, process_cpu_s, snapshot, threads_cpu_s, tree_cpu_s


def test_a_busy_child_is_charged_to_its_parents_tree() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt=time.process_time()\nwhile time.process_time()-t<0.3: pass\ninput()",
        ],
        stdin=subprocess.PIPE,
    )
    try:
        while process_cpu_s(child.pid) < 0.25:
            pass
        assert tree_cpu_s(os.getpid()) >= process_cpu_s(os.getpid()) + 0.2
    finally:
        child.communicate(b"\n", timeout=10)
    # reaped: still charged, now through cutime + cstime
    assert tree_cpu_s(os.getpid()) >= process_cpu_s(os.getpid()) + 0.2


def test_a_gone_process_reads_zero() -> None:
    assert process_cpu_s(2**22 + 1) == 0.0
    assert tree_cpu_s(2**22 + 1) == 0.0
    assert snapshot({"gone": 2**22 + 1}) == {"gone": 0.0}


def test_per_item_milliseconds_and_total() -> None:
    out = per_item_ms({"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 3.0}, 10)
    assert out == {"a": 50.0, "b": 100.0, "total": 150.0}


def test_threads_cpu_counts_this_process_busy_work_finely() -> None:
    before = threads_cpu_s(os.getpid())
    t = time.process_time()
    while time.process_time() - t < 0.05:
        pass
    spent = threads_cpu_s(os.getpid()) - before
    assert 0.045 <= spent < 1.0
    assert threads_cpu_s(2**22 + 1) == 0.0  # no such process (beyond pid_max's default)
