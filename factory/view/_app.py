"""The web app: a Starlette application serving the front end and :class:`~factory.view.ViewData`'s answers.

Read-only by construction: the store is opened read-only and every route is
a GET. The front end (HTML, JS, CSS) is package data, read with
:mod:`importlib.resources`; nothing is fetched from a network, and the pages'
Content-Security-Policy lets them reach their own origin only. Bound to a
loopback address, the app also refuses requests whose ``Host`` is not a
loopback name, so a web page elsewhere cannot read the store through DNS
rebinding.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import TYPE_CHECKING, Any

from factory.errors import FactoryError
from factory.view._data import ENDPOINTS, ViewData

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["LOOPBACK_HOSTS", "asset", "create_app"]

#: Host names that are this machine.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
#: Front-end files served under /assets/, with their media types.
ASSETS = {"app.js": "text/javascript", "app.css": "text/css"}
#: No script, style, image or connection but the page's own origin; no frames, no forms elsewhere.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "frame-ancestors 'none'; form-action 'none'; base-uri 'none'")


def asset(name: str) -> str:
    """The text of one front-end file shipped in the package (``index.html``, ``app.js``, ``app.css``)."""
    return resources.files("factory.view").joinpath("static", name).read_text(encoding="utf-8")


def create_app(data: ViewData, *, loopback_only: bool = True) -> Starlette:
    """The Starlette application over one store's :class:`ViewData`.

    Args:
        data: What to serve.
        loopback_only: Refuse requests whose ``Host`` header is not a loopback name (keep it True whenever
            the server listens on a loopback address).

    Returns:
        An ASGI application: ``/`` (the page), ``/assets/<file>``, ``/api/<request>`` (JSON, one per
        :data:`~factory.view.ENDPOINTS` entry: 404 for an unknown run, task or branch, 400 for a bad parameter),
        ``/files/<artifact id>[-<n>].png`` (a recorded plot, see :meth:`~factory.view.ViewData.image`).
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    headers = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cache-Control": "no-store"}

    def index(request: Request) -> Response:
        return Response(asset("index.html"), media_type="text/html", headers=headers)

    def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:
            return Response("not found", status_code=404, media_type="text/plain")
        return Response(asset(name), media_type=ASSETS[name], headers=headers)

    def api(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ENDPOINTS:
            return JSONResponse({"error": f"no such request: {name}"}, status_code=404, headers=headers)
        params: dict[str, Any] = {key: request.query_params.get(key) for key in ENDPOINTS[name]}
        try:
            answer = data.answer(name, params)
        except FactoryError as exc:
            status = 400 if getattr(exc, "exit_code", 1) == 2 else 500
            return JSONResponse({"error": str(exc).splitlines()[0]}, status_code=status, headers=headers)
        if answer is None:
            return JSONResponse({"error": "not found"}, status_code=404, headers=headers)
        return Response(json.dumps(answer, ensure_ascii=False), media_type="application/json", headers=headers)

    def image(request: Request) -> Response:
        # a recorded PNG by its artifact id, only while it holds the recorded bytes (ViewData.image): a name
        # that is not one, a path, or a file changed since it was recorded is a 404
        data_bytes = data.image(request.path_params["name"])
        if data_bytes is None:
            return Response("not found", status_code=404, media_type="text/plain", headers=headers)
        return Response(data_bytes, media_type="image/png", headers=headers)

    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS))] if loopback_only else []
    return Starlette(routes=[Route("/", index), Route("/assets/{name}", static), Route("/api/{name}", api),
                               Route("/files/{name}", image)],
                     middleware=middleware)
