"""The suite's own guards: a hung test fails within its limit instead of holding `make test` (pytest-timeout)."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

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
