"""``tuner serve``: the stored results over HTTP, read-only, and a page that shows them.

    tuner serve --db sqlite:///tuner.db            # http://127.0.0.1:8765/ , schema at /openapi.json
    curl 'http://127.0.0.1:8765/best?family=attention&shape=2,8,1024,64&dtype=fp16&causal=true'

Every route calls :class:`tuner.answers.reader.Reader` and returns what it gives, which is what the
matching ``--json`` command prints; nothing is computed here. The problem flags of the families
are query parameters named as on the command line (``causal=true``, ``layout=nt``). A bad query
is a 4xx with one line, ``{"detail": "..."}``: 400 for a value the tuner refuses, 404 for
nothing stored, 409 for a winner of an older template (export), 422 for a parameter missing or
of the wrong type; 503 when the database cannot be read.

``--run-jobs`` also runs the jobs clients queue (``POST /jobs``, :mod:`tuner.jobs`); submitting and
cancelling need a token of the write scope. On an address other than loopback every request but
the page's own files (``/``, ``/page.js``) needs a token, and the server refuses to start where
none was ever created. The page sends the token typed into it.

FastAPI and uvicorn are imported here only: ``pip install 'kernel-tuner-service[serve]'``.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from contextlib import ExitStack
from importlib import resources
from typing import Any, Callable

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tuner import database
from tuner.answers.reader import Reader
from tuner.errors import DatabaseError, NotFound, TemplateMismatch, TunerError, UsageError, first_line
from tuner.jobs import tokens
from tuner.jobs.routes import Access, add_job_routes

logger = logging.getLogger("tuner")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
PROBLEM_QUERY = ("family", "shape", "dtype", "device")  # the rest of a /best or /export query: flags
STATUS = {UsageError: 400, NotFound: 404, TemplateMismatch: 409, DatabaseError: 503}

ERROR = {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}},
         "additionalProperties": False}
_OBJECT = {"type": "object"}
_NUMBER = {"type": ["number", "null"]}
BEST = {"type": "object", "required": ["family", "shape", "dtype", "flags", "params", "measured", "source"],
        "properties": {"family": {"type": "string"}, "shape": {"type": "array", "items": {"type": "integer"}},
                       "dtype": {"type": "string"}, "flags": _OBJECT, "params": _OBJECT,
                       "measured": {"type": "boolean"}, "source": {"type": "string"},
                       "median_ms": {"type": "number"}, "interval_ms": _NUMBER, "tflops": _NUMBER,
                       "device": _OBJECT, "passed_over": {"type": "array", "items": {"type": "string"}}}}
EXPORT = {"type": "object", "required": ["name", "source", "launch"],
          "properties": {"name": {"type": "string"}, "source": {"type": "string"}, "launch": _OBJECT}}
STUDY = {"type": "object", "required": ["id", "name", "family", "status", "n_trials", "n_ok", "n_failed", "settings"],
         "properties": {"id": {"type": "integer"}, "name": {"type": "string"}, "family": {"type": "string"},
                        "status": {"type": "string", "enum": ["running", "finished", "interrupted"]},
                        "n_trials": {"type": "integer"}, "n_ok": {"type": "integer"},
                        "n_failed": {"type": "integer"}, "best_median_ms": _NUMBER, "settings": _OBJECT}}
DETAIL = {"type": "object", "required": ["study", "trials"],
          "properties": {"study": STUDY, "trials": {"type": "array", "items": {
              "type": "object", "required": ["number", "params", "status"],
              "properties": {"number": {"type": "integer"}, "params": _OBJECT,
                             "status": {"type": "string", "enum": ["ok", "failed"]},
                             "median_ms": _NUMBER}}}}}
COVERAGE = {"type": "object", "required": ["family", "template_hash", "rows", "rule"],
            "properties": {"family": {"type": "string"}, "template_hash": {"type": "string"},
                           "rows": {"type": "array", "items": _OBJECT}, "rule": _OBJECT}}
FAMILIES = {"type": "array", "items": {"type": "object", "required": ["name", "template_hash", "flags"]}}


def _offline_docs(app: FastAPI) -> None:
    """``/docs``: Swagger UI from the files of the ``fastapi-offline`` package, served here, so
    that the page works with no network (FastAPI's own loads them from a CDN); without that
    package, ``/docs`` is off and ``/openapi.json`` is the schema."""
    try:
        import fastapi_offline
    except ImportError:
        return
    from pathlib import Path

    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.staticfiles import StaticFiles

    assets = Path(fastapi_offline.__file__).parent / "static"
    app.mount("/docs-assets", StaticFiles(directory=assets), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def docs() -> Any:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="kernel tuner: API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon.png")


def create_app(reader: Reader, access: Access | None = None) -> FastAPI:
    """The application over ``reader`` (opened by the caller, who closes it); ``access``: who
    may do what, and where jobs are written (None: reads open, no jobs queued)."""
    access = access or Access()
    app = FastAPI(title="kernel tuner", version="1", summary="Stored tuning results, and jobs to tune more",
                  openapi_url="/openapi.json", docs_url=None, redoc_url=None)
    _offline_docs(app)
    if not access.open_reads:
        _tokens_for_reads(app, reader)
    flags = _flag_parameters(reader)
    catalogue = reader.catalogue()
    family_query = Query(description="kernel family", examples=list(reader.families),
                         json_schema_extra={"enum": list(reader.families)})
    shape_query = Query(description="the problem's dimensions, comma-separated, as the family takes them",
                        examples=["2,8,1024,64"],  # the family checks it, and says what it takes
                        json_schema_extra={"pattern": r"^[0-9]+(,[0-9]+)*$"})
    dtypes = sorted({d for f in catalogue for d in f["dtypes"]})
    dtype_query = Query(description="element type", examples=dtypes[:1], json_schema_extra={"enum": dtypes})
    device_query = Query(None, description="only results on this GPU name, e.g. NVIDIA H200")

    def answers(*codes: int, ok: dict[str, Any]) -> dict[int | str, Any]:
        found: dict[int | str, Any] = {200: {"description": "the answer",
                                             "content": {"application/json": {"schema": ok}}}}
        for code in codes:
            found[code] = {"description": _WHY[code], "content": {"application/json": {"schema": ERROR}}}
        return found

    problem_codes = (400, 404, 422, 503)
    # /best and /export answer from the reader's cache on the event loop (a thread hand-off costs
    # more than the answer, and threads contend for the GIL); an answer not cached yet (a shape
    # never tuned reads every best) is read in the threadpool, as the other routes are (studies
    # and coverage read every trial), so that it holds up no other request.

    @app.get("/best", responses=answers(*problem_codes, ok=BEST), openapi_extra={"parameters": flags},
             summary="The stored winner of a problem, or the config picked for a shape never tuned")
    async def best(request: Request, family: str = family_query, shape: str = shape_query,
                   dtype: str = dtype_query, device: str | None = device_query) -> Any:
        return await _answer_soon(reader, "best", lambda: (family, shape, dtype, _flags(request, flags), device))

    @app.get("/export", responses=answers(*problem_codes, 409, ok=EXPORT), openapi_extra={"parameters": flags},
             summary="The winner's CUDA source and launch document, as `tuner export` writes them")
    async def export(request: Request, family: str = family_query, shape: str = shape_query,
                     dtype: str = dtype_query, device: str | None = device_query) -> Any:
        return await _answer_soon(reader, "export", lambda: (family, shape, dtype, _flags(request, flags), device))

    @app.get("/studies", responses=answers(400, 503, ok={"type": "array", "items": STUDY}),
             summary="Every study: its problem, status, trials measured of its budget (settings.trials), best")
    def studies(request: Request) -> Any:
        return _answer(lambda: _no_extra(request, ()) or reader.studies())

    @app.get("/studies/{study:path}", responses=answers(400, 404, 503, ok=DETAIL),
             summary="One study (its name or id) and all its trials")
    def show(request: Request, study: str) -> Any:
        return _answer(lambda: _no_extra(request, ()) or reader.show(study))

    @app.get("/coverage", responses=answers(400, 422, 503, ok=COVERAGE),
             summary="Each stored best of a family by problem, GPU and template; the rule's score")
    def coverage(request: Request, family: str = family_query) -> Any:
        return _answer(lambda: _no_extra(request, ("family",)) or reader.coverage(family))

    @app.get("/families", responses=answers(400, ok=FAMILIES),
             summary="The families served, with their current template and problem flags")
    def families(request: Request) -> Any:
        return _answer(lambda: _no_extra(request, ()) or reader.catalogue())

    add_job_routes(app, reader, access)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> Response:
        return HTMLResponse(_asset("index.html"))

    @app.get("/page.js", include_in_schema=False)
    def script() -> Response:
        return Response(_asset("page.js"), media_type="text/javascript")

    @app.exception_handler(RequestValidationError)
    def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part not in ("query", "path"))
        message = first.get("msg", "invalid request")
        return JSONResponse({"detail": f"{where}: {message}" if where else message}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"detail": first_line(Exception(str(error.detail)))}, status_code=error.status_code,
                            headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.exception("serve: %s %s failed", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error: {first_line(error)}"}, status_code=500)

    return app


def _tokens_for_reads(app: FastAPI, reader: Reader) -> None:
    """Every request but the job routes' (which say what they need) and the page's own files
    (which hold no data; the page sends the token typed into it) answered only with a token of
    either scope: 401 and one line without one."""

    @app.middleware("http")
    async def needs_token(request: Request, call_next: Callable[[Request], Any]) -> Response:
        path = request.url.path
        if path in PAGE_FILES or path == "/jobs" or path.startswith("/jobs/"):
            return await call_next(request)
        try:
            scope = await run_in_threadpool(tokens.scope_of, reader.repo, request.headers.get("authorization"))
        except TunerError as error:
            return JSONResponse({"detail": str(error)}, status_code=503)
        if not tokens.allows(scope, "read"):
            return JSONResponse({"detail": "this server answers only with a token (Authorization: Bearer TOKEN)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return await call_next(request)


PAGE_FILES = ("/", "/page.js")
_WHY = {400: "a value the tuner refuses (unknown family, bad shape, dtype or flag, unknown parameter)",
        404: "nothing stored for it", 409: "the winner was measured with an older template",
        422: "a parameter missing or of the wrong type", 503: "the database cannot be read"}


def _answer(call: Callable[[], Any]) -> JSONResponse:
    try:
        return JSONResponse(call())
    except TunerError as error:
        return JSONResponse({"detail": str(error)}, status_code=STATUS.get(type(error), 400))


async def _answer_soon(reader: Reader, what: str, given: Callable[[], tuple[Any, ...]]) -> JSONResponse:
    """``reader.best`` or ``reader.export`` of the query: from the cache at once where it holds
    it, else read in a thread."""
    try:
        query = given()
        found = reader.cached(what, *query)
        if found is None:
            found = await run_in_threadpool(getattr(reader, what), *query)
        return JSONResponse(found)
    except TunerError as error:
        return JSONResponse({"detail": str(error)}, status_code=STATUS.get(type(error), 400))


def _flags(request: Request, declared: list[dict[str, Any]]) -> dict[str, Any]:
    """The query's problem flags: every parameter past family, shape, dtype and device (the
    family says which it has, and refuses the others in one line)."""
    query = request.query_params
    repeated = [name for name in query if len(query.getlist(name)) > 1]
    if repeated:
        raise UsageError(f"query parameter {repeated[0]!r} is given more than once")
    return {name: value for name, value in query.items() if name not in PROBLEM_QUERY}


def _no_extra(request: Request, allowed: tuple[str, ...]) -> None:
    unknown = [name for name in request.query_params if name not in allowed]
    if unknown:
        takes = ", ".join(allowed) if allowed else "none"
        raise UsageError(f"unknown query parameter {unknown[0]!r} (this endpoint takes: {takes})")


def _flag_parameters(reader: Reader) -> list[dict[str, Any]]:
    """The families' problem flags as OpenAPI query parameters: a switch a boolean, a choice one
    of its values; a flag of several families takes what any of them does."""
    merged: dict[str, dict[str, Any]] = {}
    for family in reader.catalogue():
        for flag in family["flags"]:
            entry = merged.setdefault(flag["name"], {"families": [], "switch": True, "choices": []})
            entry["families"].append(family["name"])
            entry["switch"] = entry["switch"] and flag["switch"]
            entry["choices"] += [str(c).lower() if isinstance(c, bool) else str(c) for c in flag["choices"]
                                 if str(c) not in entry["choices"]]
    return [{"name": name, "in": "query", "required": False,
             "description": f"problem flag of {', '.join(e['families'])}, as --{name.replace('_', '-')} on the command line",
             "schema": {"type": "boolean"} if e["switch"] else {"type": "string", "enum": sorted(set(e["choices"]))}}
            for name, e in sorted(merged.items())]


def _asset(name: str) -> str:
    return (resources.files("tuner.answers") / "page" / name).read_text(encoding="utf-8")


def serve(db: str | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, jobs: Any = None) -> None:
    """Open ``db`` read-only (refused in one line: missing, not a tuner database, another
    version's schema) and serve it until interrupted; its job queue is written through a
    connection of its own. ``jobs`` (a ``tuner.jobs.scheduler.SchedulerOptions``): also run
    the queued jobs, in a process of its own (``tuner.jobs.process``; None: not). Off loopback, refused where no token exists."""
    import uvicorn

    from tuner.answers.reader import open_reader

    url = database.url(db)
    with open_reader(url) as reader, database.writer(url) as writer, ExitStack() as running:
        loopback = is_loopback(host)
        if not loopback and database.call(reader.repo.token_count) == 0:
            raise UsageError(f"refusing to serve on {host} without a token: create one with "
                             "`tuner token create --scope read` (or write), or serve on 127.0.0.1")
        app = create_app(reader, Access(writer=writer, open_reads=loopback))
        listening = _listen(host, port)  # here, so that a port in use is one line of ours
        if jobs is not None:
            _run_jobs(running, url, reader, jobs)
        # the stored bests answered once before they are asked: the first /best of a tuned
        # problem is then as quick as the next (a shape never tuned reads the rule's inputs once)
        threading.Thread(target=reader.warm, name="warm-answers", daemon=True).start()
        logger.info("serving %s on http://%s:%d/ (%s; API schema at /openapi.json)",
                    reader.repo.url, host, listening.getsockname()[1],
                    "running jobs" if jobs is not None else "read-only")
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
        with listening:
            uvicorn.Server(config).run(sockets=[listening])


def _run_jobs(running: ExitStack, url: str, reader: Reader, options: Any) -> None:
    """The scheduler, with Ray, in a process of its own until ``running`` closes (after the
    server stops: the slices running then finish first)."""
    from tuner.jobs.process import SchedulerProcess

    jobs = SchedulerProcess(url, options, reader.families[0])
    jobs.start()
    running.callback(jobs.close)


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is this machine's loopback."""
    try:
        found = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return bool(found) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in found)


def _listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening, or one UsageError saying why not."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    family, kind, proto, _, address = found[0]
    listening = socket.socket(family, kind, proto)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind(address)
        listening.listen(2048)
    except OSError as error:
        listening.close()
        raise UsageError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    listening.setblocking(False)
    return listening
