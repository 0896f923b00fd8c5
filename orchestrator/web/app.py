"""The Starlette app of `tcplab serve`: GET routes only, Jinja2 templates with autoescape, plotly.js and the page's
own script served from this process (the page needs no network), a Content-Security-Policy that allows scripts
from this origin only (the data of a plot travels as JSON, never as inline script).

Routes: / (run list), /run/{id} (+ /run/{id}/figures.json), /plan/{name}, /campaigns, /campaign/{name},
/compare?a=SEL&b=SEL, /static/..., /healthz. docs/web.md says what each page shows.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from markupsafe import Markup
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from analysis.report import fmt_cell
from orchestrator.web import views

HERE = Path(__file__).resolve().parent
CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")


def plotly_js() -> Path:
    """plotly.min.js as the plotly package ships it."""
    import plotly

    return Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


def _json_script(value: Any) -> str:
    """JSON for a <script type="application/json"> block: '<', '>' and '&' escaped so no markup can end it."""
    text = json.dumps(value, allow_nan=False, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def make_env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(cell=fmt_cell, pretty=_pretty, json_script=lambda v: Markup(_json_script(v)),
                       u=lambda s: quote(str(s), safe=""))
    return env


class SecurityHeaders:
    """ASGI middleware: the CSP and friends on every response."""

    HEADERS = ((b"content-security-policy", CSP.encode()), (b"x-content-type-options", b"nosniff"),
               (b"referrer-policy", b"no-referrer"))

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(engine: Engine, title: str = "tcplab") -> Starlette:
    """The app over an engine opened read-only (orchestrator/web/db.open_readonly)."""
    env = make_env()

    def page(request: Request, template: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        body = env.get_template(template).render(request=request, title=title, **ctx)
        return HTMLResponse(body, status_code=status)

    def guarded(handler):
        def endpoint(request: Request) -> Response:
            try:
                return handler(request)
            except views.NotFound as exc:
                if request.url.path.endswith(".json"):
                    return JSONResponse({"error": str(exc)}, status_code=404)
                return page(request, "error.html", 404, message=str(exc))
            except SQLAlchemyError as exc:
                msg = f"the database could not answer: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                if request.url.path.endswith(".json"):
                    return JSONResponse({"error": msg}, status_code=500)
                return page(request, "error.html", 500, message=msg)
        return endpoint

    def runs(request: Request) -> Response:
        return page(request, "runs.html", **views.run_list(engine, request.query_params))

    def run(request: Request) -> Response:
        return page(request, "run.html", **views.run_page(engine, request.path_params["run_id"]))

    def run_figures(request: Request) -> Response:
        data = views.run_figure_data(engine, request.path_params["run_id"])
        return Response(_json_script(data), media_type="application/json")

    def plan(request: Request) -> Response:
        return page(request, "plan.html", **views.plan_page(engine, request.path_params["name"]))

    def campaigns(request: Request) -> Response:
        return page(request, "campaigns.html", **views.index_lists(engine))

    def campaign(request: Request) -> Response:
        raw = request.query_params.get("night", "")
        night = int(raw) if raw.isdigit() else None
        return page(request, "campaign.html", **views.campaign_page(engine, request.path_params["name"], night))

    def compare(request: Request) -> Response:
        qp = request.query_params
        ctx = views.compare_page(engine, qp.get("a", "").strip()[:200], qp.get("b", "").strip()[:200])
        return page(request, "compare.html", 400 if ctx["error"] else 200, **ctx)

    def healthz(_request: Request) -> Response:
        return PlainTextResponse("ok")

    def plotly(_request: Request) -> Response:
        return FileResponse(plotly_js(), media_type="text/javascript",
                            headers={"Cache-Control": "public, max-age=86400"})

    routes = [
        Route("/", guarded(runs)),
        Route("/run/{run_id:path}/figures.json", guarded(run_figures)),
        Route("/run/{run_id:path}", guarded(run)),
        Route("/plan/{name:path}", guarded(plan)),
        Route("/campaigns", guarded(campaigns)),
        Route("/campaign/{name:path}", guarded(campaign)),
        Route("/compare", guarded(compare)),
        Route("/healthz", healthz),
        Route("/static/plotly.min.js", plotly),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(SecurityHeaders)])
    app.state.engine = engine
    return app
