"""edgespec: exact speculative decoding for on-device LLMs."""

from edgespec.api import Engine, Result, Stream, load
from edgespec.errors import EdgespecError
from edgespec.runtime.loop import Event, Stats
from edgespec.runtime.sampling import SamplingParams

__version__ = "0.1.0"
__all__ = ["load", "Engine", "Result", "Stream", "Event", "Stats", "SamplingParams", "EdgespecError"]
