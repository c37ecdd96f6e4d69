"""The one compiled part: fused passes over a row of logits (edgespec/decode/rows.py). Optional: where no C
compiler is found the build goes on and numpy makes the same passes. Everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("edgespec.decode._rows", ["edgespec/decode/_rows.c", "edgespec/decode/_weights.c"],
                                 optional=True)])
