"""The suite's own guards: a hung test fails within its limit instead of holding `make test` (pytest-timeout), and
`make test`'s workers each keep to their own cores."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).parents[2] / "pyproject.toml"


def test_a_hung_test_fails_with_its_threads_stacks_and_the_run_goes_on(tmp_path):
    """A test whose main thread waits forever on a decode thread that never answers fails at its time limit, with
    that thread's stack printed, and the tests after it run. The limit is the project's (pyproject.toml), set
    here to a second."""
    limit = re.search(r"^timeout = (\d+)$", PYPROJECT.read_text(), re.M)
    assert limit and 60 <= int(limit.group(1)) <= 1800, "pyproject.toml sets no per-test timeout"
    (tmp_path / "test_hung.py").write_text(textwrap.dedent("""
        import threading

        def test_hung():
            answered = threading.Event()
            threading.Thread(target=threading.Event().wait, name="decode-thread", daemon=True).start()
            answered.wait()

        def test_after():
            pass
    """))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "1",
                          "test_hung.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Timeout" in run.stdout and "decode-thread" in run.stdout and "1 failed, 1 passed" in run.stdout, run.stdout


def test_workers_get_disjoint_shares_of_the_cores(monkeypatch):
    """`make test` runs a worker a core (up to 4): conftest gives each its own share before any model starts its
    threads, and edgespec's default thread count (machine.cores) is that share, not the machine's cores."""
    import conftest

    from edgespec.machine import cores

    for machine, workers in ((2, 2), (16, 4), (3, 2), (1, 1)):
        shares = []
        for worker in range(workers):
            monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
            monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(workers))
            monkeypatch.setattr("os.sched_getaffinity", lambda pid, n=machine: set(range(n)))
            monkeypatch.setattr("os.sched_setaffinity", lambda pid, given, out=shares: out.append(set(given)))
            conftest._pin_worker()
        assert len(shares) == workers and all(len(s) == machine // workers for s in shares), (machine, shares)
        assert len(set.union(*shares)) == sum(map(len, shares)), f"workers share cores: {shares}"
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 3, 5})
    assert cores() == 3  # the mask's cores, whatever the machine's count


def test_outside_xdist_the_process_keeps_every_core(monkeypatch):
    import conftest

    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr("os.sched_setaffinity", lambda pid, given: pytest.fail(f"pinned to {given}"))
    conftest._pin_worker()


def test_no_test_reports_subtests_which_make_tests_workers_would_lose():
    """pytest-xdist (make test) runs as one the items of a test that reports subtests under one name (pytest 9's
    `subtests`, schemathesis' `schema.parametrize()` over several operations), and a failing one passed there:
    test_server_fuzz.py fuzzes each operation in a test of its own, and no test uses subtests."""
    here = Path(__file__)
    for path in here.parents[1].rglob("test_*.py"):
        text = path.read_text()
        if path != here:
            assert not re.search(r"def \w+\([^)]*\bsubtests\b|\bsubtests\.test\(", text), f"{path.name} uses subtests"
            assert not re.search(r"^@\w+\.parametrize\(\)", text, re.M), f"{path.name}: a schema's operations at once"
