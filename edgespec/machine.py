"""What this process may use of the machine it runs on."""

from __future__ import annotations

import os


def cores() -> int:
    """The CPU cores this process may run on: its affinity mask where the OS keeps one (taskset, a container's
    cpuset, a test worker given its share of the cores), else every core the machine has. The default thread
    count of llama.cpp, onnxruntime and torch here: threads beyond the mask would wait on each other's cores."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # macOS and Windows keep no mask that Python reads
        return os.cpu_count() or 1
