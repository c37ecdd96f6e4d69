"""The chat page `edgespec serve` shows at `/`: plain HTML, CSS and JavaScript shipped in this package.

No build step and no external URL: the page works on a machine with no network, and its Content-Security-Policy
lets it load nothing but the server's own files. It talks to the server's own API (/health, /v1/models,
/v1/chat/completions streamed), so the API key, when one is set, is asked for on the page and sent like any
client's; loading the page itself needs none.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.exceptions import HTTPException

ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",  # a new edgespec's page is picked up at once
}


def add_page(app: FastAPI, api_key_required: bool) -> None:
    """Serve the chat page on `app`: GET / (the HTML) and GET /page/{app.js, style.css}. api_key_required: the
    page asks for the key before the first request (it asks anyway on a 401)."""
    folder = files(__name__)
    html = folder.joinpath("index.html").read_text(encoding="utf-8")
    html = html.replace("{{KEY_REQUIRED}}", "true" if api_key_required else "false")
    assets = {name: folder.joinpath(name).read_bytes() for name in ASSETS}

    @app.get("/", include_in_schema=False)
    async def page():
        return Response(html, media_type="text/html; charset=utf-8", headers=HEADERS)

    @app.get("/page/{name}", include_in_schema=False)
    async def asset(name: str):
        if name not in assets:
            raise HTTPException(404, "Not Found")  # answered in OpenAI's shape, as other unknown URLs
        return Response(assets[name], media_type=ASSETS[name], headers=HEADERS)
