"""What long work prints on stderr while it runs (stdout belongs to --json): phase lines, a bar over steps, and a
bar following a file a tool writes. The one module that draws them (click's bar for steps, tqdm's for bytes).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path


def say(progress: bool, message: str) -> None:
    """A phase line on stderr, where progress is shown."""
    if progress:
        print(message, file=sys.stderr, flush=True)


class Steps:
    """A bar over `total` steps on stderr (starting at `done`), or nothing where progress is not shown."""

    def __init__(self, total: int, label: str, shown: bool = True, done: int = 0):
        self._bar = None
        if shown:
            import click

            self._bar = click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True)
            if done:
                self._bar.update(done)

    def step(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.render_finish()


@contextlib.contextmanager
def watch_file(path: Path, expected_bytes: float, desc: str, enabled: bool = True):
    """Show a bar on stderr following the growth of `path` while the body runs: llama.cpp's quantizer (and
    onnxruntime's) take no progress callback, and the size of the file they write, against the size it will
    have, is an honest measure of how far they are."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=int(expected_bytes), desc=desc, unit="B", unit_scale=True, file=sys.stderr, leave=True)
    done = threading.Event()

    def poll():
        while not done.wait(0.25):
            size = path.stat().st_size if path.exists() else 0
            bar.update(max(0, min(size, bar.total) - bar.n))

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        yield
        bar.update(bar.total - bar.n)  # finished: the estimate may have been a little off
    finally:
        done.set()
        watcher.join()
        bar.close()
