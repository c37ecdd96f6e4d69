#!/usr/bin/env bash
# Build (once) and print the path of a llama-cpp-python wheel for this machine.
#
# pip's wheel cache keys on the sdist only, not on CMAKE_ARGS, so a wheel built with other
# flags (or natively, which segfaults in ggml's AMX kernels on some CPUs) would be reused
# silently. We keep our own cache, keyed by version, CMAKE_ARGS, Python tag and machine.
#
# usage: scripts/llama-wheel.sh PYTHON VERSION   (prints the wheel path on stdout)
set -euo pipefail
python=${1:?python}
version=${2:?llama-cpp-python version}
cmake_args=${CMAKE_ARGS:--DGGML_NATIVE=OFF}
pytag=$("$python" -c 'import sys, platform; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
key=$(printf '%s\n%s\n%s\n' "$version" "$cmake_args" "$pytag" | sha256sum | cut -c1-16)
cache=${EDGESPEC_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec/wheels}/llama-cpp-python-$version-$key

wheel=$(ls "$cache"/llama_cpp_python-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
    echo "building llama-cpp-python $version with CMAKE_ARGS='$cmake_args' (about 10 minutes on 2 cores)" >&2
    tmp=$(mktemp -d "${cache}.tmp.XXXXXX" 2>/dev/null || { mkdir -p "$(dirname "$cache")"; mktemp -d "${cache}.tmp.XXXXXX"; })
    trap 'rm -rf "$tmp"' EXIT
    CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
        "$python" -m pip wheel --no-deps --no-cache-dir -w "$tmp" "llama-cpp-python==$version" >&2
    printf 'version=%s\nCMAKE_ARGS=%s\npython=%s\n' "$version" "$cmake_args" "$pytag" > "$tmp/BUILD_INFO"
    rm -rf "$cache" && mv "$tmp" "$cache"   # rename last, so an interrupted build leaves no cache entry
    trap - EXIT
    wheel=$(ls "$cache"/llama_cpp_python-*.whl | head -n1)
fi
echo "$wheel"
