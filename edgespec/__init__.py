"""edgespec: exact speculative decoding for on-device LLMs."""

from edgespec.api import Engine, Result, Stream, load
from edgespec.decode.loop import Event, Stats
from edgespec.decode.sampling import SamplingParams
from edgespec.errors import EdgespecError

__version__ = "0.1.0"
__all__ = ["load", "Engine", "Result", "Stream", "Event", "Stats", "SamplingParams", "EdgespecError"]
