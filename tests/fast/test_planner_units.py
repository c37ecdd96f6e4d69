"""The planner's pieces that need no model file: sizes, and device profiles (built in, a user's TOML, this machine)."""

import math
import re

import pytest

from edgespec.errors import EdgespecError
from edgespec.plan.profiles import get_profile, load_profiles
from edgespec.units import GiB, parse_size

USER_PROFILES = """
[profiles.my-board]
title = "My board"
memory_gib = 4
unified = true
reserve_gib = 0.5
bandwidth_gbs = 25.6
llama_cpp = ["cpu"]
onnxruntime = ["cpu"]
source = "https://example.com/my-board"

[profiles.rpi5-8gb]
title = "Raspberry Pi 5 8GB, headless"
memory_gib = 8
unified = true
reserve_gib = 0.25
bandwidth_gbs = 17.1
llama_cpp = ["cpu"]
onnxruntime = ["cpu"]
source = "https://example.com/rpi5"
"""


@pytest.mark.parametrize("text, size", [
    ("6GiB", 6 * 2**30), ("6GB", 6 * 10**9), ("6 gib", 6 * 2**30), ("512MiB", 512 * 2**20), ("1.5G", 1_500_000_000),
    ("800MB", 800_000_000), ("1024", 1024), ("0.5KiB", 512), ("2T", 2 * 10**12), (" 820MiB ", 820 * 2**20),
])
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "lots", "6XB", "-1GB", "1.2.3G", "6 GiB free", "1e9"])
def test_parse_size_refuses_garbage(text):
    with pytest.raises(EdgespecError, match="cannot read the budget .*6GiB"):
        parse_size(text)


REQUIRED = ["orin-nano-8gb", "orin-nano-8gb-super", "orin-nx-16gb", "agx-orin-64gb", "rtx-3060-12gb", "rtx-4060-8gb",
            "rtx-4070-12gb", "rtx-4090-24gb", "rpi5-8gb"]


def test_builtin_profiles():
    table = load_profiles()
    assert set(REQUIRED) <= set(table)
    for chip in ("m1", "m2", "m3", "m4"):
        for tier in (r"\d+gb", r"pro-\d+gb", r"max-\d+gb"):
            assert any(re.fullmatch(rf"{chip}-{tier}", name) for name in table), (chip, tier)
    for name, p in table.items():
        assert p.name == name and p.title
        assert p.memory_bytes > 0 and p.bandwidth > 0, name
        assert 0 < p.capacity < p.memory_bytes, name
        assert p.source.startswith("http"), name
        assert "cpu" in p.llama_cpp and "cpu" in p.onnxruntime, name
    assert all(not table[n].unified and table[n].gpu == "cuda" and table[n].host_bandwidth for n in REQUIRED
               if n.startswith("rtx"))
    assert table["orin-nano-8gb"].unified and table["orin-nano-8gb"].gpu == "cuda"
    assert table["rpi5-8gb"].gpu is None and table["m2-8gb"].gpu == "metal"
    assert table["orin-nano-8gb-super"].bandwidth > table["orin-nano-8gb"].bandwidth
    assert table["rtx-4090-24gb"].memory_bytes == 24 * GiB


def test_user_profiles_add_and_override(tmp_path, monkeypatch):
    path = tmp_path / "profiles.toml"
    path.write_text(USER_PROFILES)
    builtin = load_profiles()
    table = load_profiles(path)
    assert set(table) == set(builtin) | {"my-board"}
    assert table["my-board"].capacity == int(3.5 * GiB) and table["my-board"].bandwidth == 25.6e9
    assert table["rpi5-8gb"].reserve_bytes == GiB // 4 and builtin["rpi5-8gb"].reserve_bytes == GiB
    assert table["orin-nano-8gb"] == builtin["orin-nano-8gb"]
    monkeypatch.setenv("EDGESPEC_PROFILES", str(path))  # the same file through the environment
    assert get_profile("my-board") == table["my-board"] and get_profile("rpi5-8gb").title.endswith("headless")


@pytest.mark.parametrize("text, message", [
    (USER_PROFILES.replace("bandwidth_gbs = 25.6\n", ""), "profile 'my-board' in .*profiles.toml lacks bandwidth_gbs"),
    (USER_PROFILES.replace("memory_gib = 4", 'memory_gib = "lots"'), "profile 'my-board' .* has a bad value"),
    (USER_PROFILES.replace('title = "My board"', "title = My board"), "profiles.toml is not valid TOML"),
])
def test_bad_profile_files_are_clear_errors(tmp_path, text, message):
    path = tmp_path / "profiles.toml"
    path.write_text(text)
    with pytest.raises(EdgespecError, match=message):
        load_profiles(path)


def test_unknown_profile_and_missing_file_are_clear_errors(tmp_path):
    with pytest.raises(EdgespecError, match="unknown device profile 'orin-nano-9gb': choose one of auto, .*rpi5-8gb"):
        get_profile("orin-nano-9gb")
    with pytest.raises(EdgespecError, match="profile file not found"):
        get_profile("rpi5-8gb", tmp_path / "absent.toml")


def test_auto_profile(monkeypatch):
    from edgespec.plan import profiles

    quick = get_profile("auto", measure=False)
    assert quick.memory_bytes > 0 and 0 < quick.capacity <= quick.memory_bytes and math.isnan(quick.bandwidth)
    assert "cpu" in quick.llama_cpp and quick.measured["ram_total"] > 0
    # what a copy measures is the machine's (a busy one reads slow); the profile carries whatever it measured
    monkeypatch.setattr(profiles, "measure_bandwidth", lambda: 12.5e9)
    measured = get_profile("auto", measure=True)
    assert measured.bandwidth == measured.measured["bandwidth_measured"] == 12.5e9


def test_bandwidth_is_bytes_moved_over_the_fastest_copy(monkeypatch):
    """A copy reads and writes each byte once; the best of the reps counts. The clock is injected, so the
    arithmetic is checked and no machine's speed is."""
    from types import SimpleNamespace

    from edgespec.plan import profiles

    readings = iter([10.0, 10.5, 11.0, 11.25, 12.0, 12.75])  # three copies: 0.5 s, 0.25 s, 0.75 s
    monkeypatch.setattr(profiles, "time", SimpleNamespace(perf_counter=lambda: next(readings)))
    assert profiles.measure_bandwidth(n_bytes=2**16, reps=3) == 2 * 2**16 / 0.25
    assert next(readings, None) is None  # each copy timed once, nothing else
