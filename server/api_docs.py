"""The interactive API docs at /docs: Swagger UI served from the package (vendored under
server/dashboard/static/vendor, no CDN), started by a static script so the page needs no inline
script under the Content-Security-Policy (server/security_headers.py)."""

from __future__ import annotations

from html import escape

from fastapi import FastAPI
from fastapi.responses import HTMLResponse

SWAGGER_VERSION = "5.35.0"
SWAGGER_JS = f"/static/vendor/swagger-ui-{SWAGGER_VERSION}-bundle.js"
SWAGGER_CSS = f"/static/vendor/swagger-ui-{SWAGGER_VERSION}.css"
INIT_JS = "/static/api-docs.js"
FAVICON = "/static/favicon.svg"


def docs_html(title: str, openapi_url: str) -> str:
    return f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>{escape(title)} · API docs</title>
  <link rel="icon" href="{FAVICON}" type="image/svg+xml">
  <link rel="stylesheet" href="{SWAGGER_CSS}">
  <script src="{SWAGGER_JS}" defer></script>
  <script src="{INIT_JS}" defer></script>
</head>
<body>
  <div id="swagger-ui" data-openapi-url="{escape(openapi_url)}"></div>
</body>
</html>
"""


def install(app: FastAPI) -> None:
    """GET /docs (the app is created with docs_url=None and redoc_url=None)."""
    openapi_url = app.openapi_url or "/openapi.json"
    page = docs_html(app.title, openapi_url)

    @app.get("/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return HTMLResponse(page)
