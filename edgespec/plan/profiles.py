"""Device profiles: how much memory a device gives the models, how fast it reads it, what runs there.

The named profiles are data (edgespec/data/profiles.toml, each figure with its source); users add their
own in a file of the same format (--profiles FILE or EDGESPEC_PROFILES). `auto` describes the machine
it runs on: memory from the OS, GPU memory from llama.cpp's devices, bandwidth measured with a copy.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from edgespec.errors import EdgespecError
from edgespec.machine import cores
from edgespec.units import GiB

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

KEYS = ("title", "memory_gib", "unified", "reserve_gib", "bandwidth_gbs", "llama_cpp", "onnxruntime", "source")


@dataclass(frozen=True)
class Profile:
    name: str
    title: str
    memory_bytes: int  # unified RAM (CPU-only and unified devices) or the GPU's VRAM (discrete GPUs)
    unified: bool  # CPU and GPU share memory_bytes
    reserve_bytes: int  # left to the OS, display, driver and other software
    bandwidth: float  # bytes/s of memory_bytes' memory
    llama_cpp: tuple[str, ...]  # llama.cpp backends there: cuda, metal, vulkan, cpu
    onnxruntime: tuple[str, ...]  # onnxruntime providers there: tensorrt, cuda, coreml, cpu
    source: str
    note: str = ""
    host_bandwidth: float | None = None  # discrete GPUs: host RAM bandwidth, for layers left on the CPU
    measured: dict = field(default_factory=dict)  # auto: what was read or measured, for the report

    @property
    def capacity(self) -> int:
        """Bytes the planner may use."""
        return max(self.memory_bytes - self.reserve_bytes, 0)

    @property
    def gpu(self) -> str | None:
        """The llama.cpp GPU backend the profile has, if any."""
        return next((b for b in self.llama_cpp if b != "cpu"), None)


def _parse(name: str, entry: dict, origin: str) -> Profile:
    missing = [k for k in KEYS if k not in entry]
    if missing:
        raise EdgespecError(f"profile '{name}' in {origin} lacks {', '.join(missing)}")
    try:
        return Profile(
            name=name, title=str(entry["title"]), memory_bytes=int(float(entry["memory_gib"]) * GiB),
            unified=bool(entry["unified"]), reserve_bytes=int(float(entry["reserve_gib"]) * GiB),
            bandwidth=float(entry["bandwidth_gbs"]) * 1e9, llama_cpp=tuple(entry["llama_cpp"]),
            onnxruntime=tuple(entry["onnxruntime"]), source=str(entry["source"]), note=str(entry.get("note", "")),
            host_bandwidth=float(entry["host_bandwidth_gbs"]) * 1e9 if "host_bandwidth_gbs" in entry else None,
        )
    except (TypeError, ValueError) as e:
        raise EdgespecError(f"profile '{name}' in {origin} has a bad value: {e}") from None


def _read(text: str, origin: str) -> dict[str, Profile]:
    try:
        table = tomllib.loads(text).get("profiles", {})
    except tomllib.TOMLDecodeError as e:
        raise EdgespecError(f"{origin} is not valid TOML: {e}") from None
    return {name: _parse(name, entry, origin) for name, entry in table.items()}


def load_profiles(extra: str | os.PathLike | None = None) -> dict[str, Profile]:
    """The built-in profiles, then those of `extra` (or $EDGESPEC_PROFILES), which may override them."""
    profiles = _read(resources.files("edgespec").joinpath("data/profiles.toml").read_text("utf-8"), "profiles.toml")
    extra = extra or os.environ.get("EDGESPEC_PROFILES")
    if extra:
        path = Path(extra)
        if not path.is_file():
            raise EdgespecError(f"profile file not found: {path}")
        profiles.update(_read(path.read_text("utf-8"), str(path)))
    return profiles


def get_profile(name: str, extra: str | os.PathLike | None = None, *, measure: bool = True) -> Profile:
    """A profile by name; 'auto' is this machine (its bandwidth is measured only if `measure`)."""
    if name == "auto":
        return auto_profile(measure=measure)
    profiles = load_profiles(extra)
    if name not in profiles:
        raise EdgespecError(f"unknown device profile '{name}': choose one of auto, {', '.join(sorted(profiles))} "
                            "(edgespec profiles lists them), or add it to a --profiles file")
    return profiles[name]


def measure_bandwidth(n_bytes: int = 64 * 2**20, reps: int = 5) -> float:
    """Bytes/s of a large array copy (it reads and writes each byte once): the best of `reps`."""
    src = np.ones(n_bytes // 8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return 2 * n_bytes / best


def auto_profile(measure: bool = True) -> Profile:
    """This machine: available RAM from the OS (or the GPU's free memory, where llama.cpp reports a GPU).

    Without `measure` (loading under a plan), neither the bandwidth is measured (a 128 MiB copy) nor
    onnxruntime imported to list its providers: neither should count in the process's peak memory.
    """
    import psutil

    from edgespec.backends.llama.lib import devices
    from edgespec.backends.onnx.folder import available_providers

    ram = psutil.virtual_memory()
    gpus = [d for d in devices() if d["type"] in ("gpu", "igpu")]
    measured = {"ram_total": ram.total, "ram_available": ram.available, "gpus": gpus}
    llama = ("cpu",)
    if gpus and gpus[0]["type"] == "gpu":  # discrete: the models go to its free VRAM
        memory, reserve, unified = gpus[0]["total"], gpus[0]["total"] - gpus[0]["free"], False
        llama = (gpus[0]["backend"], "cpu")
    else:  # CPU or integrated GPU: what the OS says is available now
        memory, reserve, unified = ram.total, ram.total - ram.available, True
        if gpus:
            llama = (gpus[0]["backend"], "cpu")
    bandwidth = measure_bandwidth() if measure else float("nan")
    measured["bandwidth_measured"] = bandwidth
    return Profile(name="auto", title=f"this machine ({cores()} cores)", memory_bytes=memory, unified=unified,
                   reserve_bytes=reserve, bandwidth=bandwidth, llama_cpp=llama,
                   onnxruntime=available_providers() if measure else (),
                   source="measured: OS memory counters, llama.cpp devices, a numpy copy", measured=measured)


