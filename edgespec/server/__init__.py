"""`edgespec serve`: the OpenAI-compatible HTTP server (FastAPI on uvicorn) over what `load` or `Parallel` loaded.

app.py: the routes, streaming and the slots; requests.py: the bodies it accepts, read strictly; limits.py: its
queue, time limit and /metrics; errors.py: its OpenAI-shaped errors. Tool calls are the Python API's too
(edgespec/tool_calls.py, which Engine uses to write a prompt's tools and read an answer's calls), so they sit below
the server, not in it.
"""

from edgespec.server.app import Slots, create_app, loading_thread, serve

__all__ = ["Slots", "create_app", "loading_thread", "serve"]
