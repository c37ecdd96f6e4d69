"""Sizes in bytes, read and written the one way every floor of the package shares (a budget, a prompt cache's size,
a plan's figures): a module that imports nothing of the package but its error."""

from __future__ import annotations

import re

from edgespec.errors import EdgespecError

MiB = 2**20
GiB = 2**30


def parse_size(text: str, what: str = "budget") -> int:
    """'6GiB', '6 GB', '512MiB', '1.5G', or a number of bytes; `what` names it in the error."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?)b?\s*", str(text).lower())
    if not m:
        raise EdgespecError(f"cannot read the {what} '{text}': write it like 6GiB, 6GB or 512MiB")
    number, prefix, binary = m.groups()
    scale = (1024 if binary or not prefix else 1000) ** "_kmgt".index(prefix or "_")
    return int(float(number) * scale)


def mib_text(n: int) -> str:
    """Bytes as MiB under 10 GiB, else as GiB."""
    return f"{n / MiB:.1f} MiB" if n < 10 * GiB else f"{n / GiB:.2f} GiB"
