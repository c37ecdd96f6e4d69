"""A progress bar for tools that report no progress but write their output as they go.

llama.cpp's quantizer (and onnxruntime's) take no progress callback; the size of the file they are
writing, against the size it will have, is an honest measure of how far they are.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from pathlib import Path


@contextlib.contextmanager
def watch_file(path: Path, expected_bytes: float, desc: str, enabled: bool = True):
    """Show a bar on stderr following the growth of `path` while the body runs."""
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
