"""The job routes of ``tuner serve``, and who may call them.

    POST   /jobs             a job (family, problems, trials, priority): 201 and its id
    GET    /jobs             every job, newest first: state, progress, best so far, ETA
    GET    /jobs/{id}        one job, its problems each with its study's progress
    GET    /jobs/{id}/events its progress as server-sent events, until it is over
    DELETE /jobs/{id}        cancel it: the slice running finishes and stores its trials

Submitting and cancelling need a token of the write scope (``Authorization: Bearer ...``,
:mod:`tuner.jobs.tokens`); reads need one of either scope where the server is not on loopback
(:class:`Access`). A body is at most ``MAX_BODY_BYTES``; a job is checked
(:func:`tuner.jobs.spec.check_job`) before anything is queued, and refused with 422 and one line.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Awaitable, Callable

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from tuner import database
from tuner.errors import DatabaseError, TunerError, UsageError
from tuner.jobs import spec, tokens
from tuner.study import search

EVENT_POLL_S = 1.0
MAX_ID = 2**31 - 1  # a job's id, as a path takes it
NEEDS_WRITE = "submitting and cancelling jobs need a token of the write scope (Authorization: Bearer TOKEN)"
NEEDS_READ = "this server answers only with a token (Authorization: Bearer TOKEN)"

_ERROR = {"type": "object", "required": ["detail"], "properties": {"detail": {"type": "string"}},
          "additionalProperties": False}
_NUMBER = {"type": ["number", "null"]}
_TEXT = {"type": ["string", "null"]}
PROBLEM_IN = {"type": "object", "required": ["shape", "dtype"], "additionalProperties": False,
              "properties": {"shape": {"type": "string", "pattern": r"^[0-9]+(,[0-9]+)*$", "maxLength": 64,
                                       "examples": ["2,8,1024,64"]},
                             "dtype": {"type": "string", "maxLength": 16, "examples": ["fp16"]},
                             "flags": {"type": "object", "maxProperties": 16}}}
JOB_IN = {"type": "object", "required": ["family", "problems", "trials"], "additionalProperties": False,
          "properties": {"family": {"type": "string", "maxLength": 64},
                         "problems": {"type": "array", "items": PROBLEM_IN, "minItems": 1,
                                      "maxItems": spec.MAX_PROBLEMS},
                         "trials": {"type": "integer", "minimum": 1, "maximum": spec.MAX_TRIALS},
                         "priority": {"type": "integer", "minimum": -spec.MAX_PRIORITY,
                                      "maximum": spec.MAX_PRIORITY, "default": 0},
                         "sampler": {"type": "string", "enum": list(search.SAMPLERS), "default": "tpe"},
                         "seed": {"type": ["integer", "null"]}}}
PROBLEM_OUT = {"type": "object", "required": ["shape", "dtype", "flags", "state", "measured"],
               "properties": {"shape": {"type": "array", "items": {"type": "integer"}}, "dtype": {"type": "string"},
                              "flags": {"type": "object"},
                              "state": {"type": "string", "enum": ["waiting", "done", "failed"]},
                              "reason": _TEXT, "study": _TEXT, "measured": {"type": "integer"},
                              "best_median_ms": _NUMBER}}
JOB_OUT = {"type": "object",
           "required": ["id", "family", "priority", "trials", "state", "measured", "budget", "problems"],
           "properties": {"id": {"type": "integer"}, "family": {"type": "string"}, "priority": {"type": "integer"},
                          "trials": {"type": "integer"},
                          "state": {"type": "string", "enum": ["queued", "running", "done", "failed", "cancelled"]},
                          "reason": _TEXT, "submitted_at": {"type": "string"}, "started_at": _TEXT,
                          "finished_at": _TEXT, "held": {"type": "boolean"}, "measured": {"type": "integer"}, "budget": {"type": "integer"},
                          "best_median_ms": _NUMBER, "eta_s": _NUMBER, "problems": {"type": "array", "items": PROBLEM_OUT}}}
_WHY = {401: "no token, or one not known", 403: "a token of the read scope, where the write scope is needed",
        404: "no such job", 413: f"a body over {spec.MAX_BODY_BYTES} bytes",
        422: "a job refused (a family, problem, budget or priority it cannot take)", 503: "the database cannot be used"}


_ID = Path(ge=1, le=MAX_ID, description="the job's id")


@dataclass(frozen=True)
class Access:
    """What a server lets its callers do: ``writer`` (a ``storage.Repository`` that writes;
    None: this server queues no jobs) stores jobs; ``open_reads``: reads need no token (a
    server on loopback)."""

    writer: Any = None
    open_reads: bool = True


class Refused(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def add_job_routes(app: FastAPI, reader: Any, access: Access) -> None:
    """The job routes on ``app``; ``reader``: the server's ``tuner.answers.reader.Reader`` (its
    repository reads jobs and tokens; its families are those a job may name)."""
    repo = reader.repo
    body_schema = {**JOB_IN, "properties": {**JOB_IN["properties"], "family": {
        "type": "string", "enum": list(reader.families), "examples": list(reader.families[:1])}}}

    def answers(ok: int, schema: dict[str, Any], *codes: int) -> dict[int | str, Any]:
        found: dict[int | str, Any] = {ok: {"description": "the answer", "content": {"application/json": {"schema": schema}}}}
        for code in codes:
            found[code] = {"description": _WHY[code], "content": {"application/json": {"schema": _ERROR}}}
        return found

    read_codes = (503,) if access.open_reads else (401, 503)
    bearer = {"security": [{"bearer": []}]}

    @app.post("/jobs", status_code=201, summary="Queue a job: a family's problems, each tuned to `trials` trials",
              responses=answers(201, JOB_OUT, 401, 403, 413, 422, 503),
              openapi_extra={**bearer, "requestBody": {"required": True, "content": {"application/json": {
                  "schema": body_schema}}}})
    async def submit(request: Request) -> Any:
        async def act() -> Any:
            await _needs(repo, request, "write")
            job = spec.check_job(_json(await _body(request)))
            writer = _writer(access)
            from storage import JobSpec

            number = await run_in_threadpool(database.call, lambda: writer.submit_job(JobSpec(
                job.family, job.problems, job.trials, job.priority, job.settings)))
            return JSONResponse(job_document(await _job(writer, number)), status_code=201)
        return await _answer(act)

    @app.get("/jobs", summary="Every job, newest first, with its progress, best so far and ETA",
             responses=answers(200, {"type": "array", "items": JOB_OUT}, *read_codes))
    async def jobs(request: Request) -> Any:
        async def act() -> Any:
            await _needs(repo, request, "read", open_reads=access.open_reads)
            found = await run_in_threadpool(database.call, repo.jobs)
            return JSONResponse([job_document(j) for j in found])
        return await _answer(act)

    @app.get("/jobs/{job_id}", summary="One job: its state, each problem's progress and best so far, its ETA",
             responses=answers(200, JOB_OUT, 404, 422, *read_codes))
    async def job(request: Request, job_id: int = _ID) -> Any:
        async def act() -> Any:
            await _needs(repo, request, "read", open_reads=access.open_reads)
            return JSONResponse(job_document(await _job(repo, job_id)))
        return await _answer(act)

    @app.get("/jobs/{job_id}/events", include_in_schema=False)
    async def events(request: Request, job_id: int = _ID) -> Any:
        async def act() -> Any:
            await _needs(repo, request, "read", open_reads=access.open_reads)
            first = job_document(await _job(repo, job_id))
            return StreamingResponse(_events(repo, request, first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _answer(act)

    @app.delete("/jobs/{job_id}", summary="Cancel a job: trials in flight finish and are stored",
                responses=answers(200, JOB_OUT, 401, 403, 404, 422, 503), openapi_extra=bearer)
    async def cancel(request: Request, job_id: int = _ID) -> Any:
        async def act() -> Any:
            await _needs(repo, request, "write")
            writer = _writer(access)
            found = await run_in_threadpool(database.call, lambda: writer.cancel_job(job_id))
            if found is None:
                raise Refused(404, f"no job {job_id}")
            return JSONResponse(job_document(found))
        return await _answer(act)

    schema = app.openapi  # the bearer scheme the write routes name

    def openapi() -> dict[str, Any]:
        document = schema()
        document.setdefault("components", {}).setdefault("securitySchemes", {})["bearer"] = {
            "type": "http", "scheme": "bearer"}
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def job_document(job: Any) -> dict[str, Any]:
    """A ``storage.JobRecord`` as the API shows it: its progress (trials measured of the budget,
    each problem's counted up to its budget), its best so far, its ETA in seconds (at the
    pace since it started; None before it did, 0 once over), and ``held``: a scheduler runs a
    slice of it now (a job cancelled meanwhile: until that slice has stored its trials)."""
    measured = sum(min(p.measured, job.trials) for p in job.problems)
    budget = job.trials * len(job.problems)
    bests = [p.best_median_ms for p in job.problems if p.best_median_ms is not None]
    eta: float | None = None
    if not job.open:
        eta = 0.0
    elif job.started_at is not None and measured > 0:
        elapsed = (datetime.now(timezone.utc) - job.started_at).total_seconds()
        eta = round(max(0.0, elapsed) * (budget - measured) / measured, 1)
    return {"id": job.id, "family": job.family, "priority": job.priority, "trials": job.trials,
            "state": job.state, "reason": job.reason, "submitted_at": _time(job.submitted_at),
            "started_at": _time(job.started_at), "finished_at": _time(job.finished_at),
            "held": job.runner is not None,
            "measured": measured, "budget": budget, "best_median_ms": min(bests) if bests else None,
            "eta_s": eta, "problems": [
                {"shape": list(p.shape), "dtype": p.dtype, "flags": p.flags, "state": p.state, "reason": p.reason,
                 "study": p.study, "measured": p.measured, "best_median_ms": p.best_median_ms}
                for p in job.problems]}


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


async def _answer(act: Callable[[], Awaitable[Any]]) -> Any:
    try:
        return await act()
    except Refused as error:
        headers = {"WWW-Authenticate": "Bearer"} if error.status == 401 else None
        return JSONResponse({"detail": str(error)}, status_code=error.status, headers=headers)
    except UsageError as error:
        return JSONResponse({"detail": str(error)}, status_code=422)
    except DatabaseError as error:
        return JSONResponse({"detail": str(error)}, status_code=503)
    except TunerError as error:
        return JSONResponse({"detail": str(error)}, status_code=400)


async def _needs(repo: Any, request: Request, scope: str, *, open_reads: bool = False) -> None:
    """Refused (401, 403) unless the request's token has ``scope`` (reads: or they are open)."""
    if scope == "read" and open_reads:
        return
    header = request.headers.get("authorization")
    found = await run_in_threadpool(tokens.scope_of, repo, header)
    if tokens.allows(found, scope):
        return
    if found is not None:
        raise Refused(403, f"this token has the {found} scope; {NEEDS_WRITE}")
    if header:
        raise Refused(401, "the token is not known to this server")
    raise Refused(401, NEEDS_WRITE if scope == "write" else NEEDS_READ)


async def _body(request: Request) -> bytes:
    """The request's body, refused (413) past MAX_BODY_BYTES without reading it all."""
    limit = spec.MAX_BODY_BYTES
    too_big = Refused(413, f"the body is over {limit} bytes")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise UsageError(f"the body is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise UsageError("the body must be a JSON object with family, problems and trials")
    unknown = sorted(set(value) - set(JOB_IN["properties"]))
    if unknown:
        raise UsageError(f"unknown field {unknown[0]!r} (a job takes: {', '.join(JOB_IN['properties'])})")
    return value


def _writer(access: Access) -> Any:
    if access.writer is None:
        raise DatabaseError("this server queues no jobs: its database is open read-only")
    return access.writer


async def _job(repo: Any, job_id: int) -> Any:
    found = await run_in_threadpool(database.call, lambda: repo.job(job_id))
    if found is None:
        raise Refused(404, f"no job {job_id}")
    return found


async def _events(repo: Any, request: Request, first: dict[str, Any]):  # type: ignore[no-untyped-def]
    """``progress`` events, each the job's document when it changed, until it is over (or the
    client leaves)."""
    last: dict[str, Any] | None = None
    document = first
    while True:
        if document != last:
            yield f"event: progress\ndata: {json.dumps(document)}\n\n"
            last = document
        if document["state"] not in ("queued", "running") or await request.is_disconnected():
            return
        await asyncio.sleep(EVENT_POLL_S)
        found = await run_in_threadpool(database.call, lambda: repo.job(first["id"]))
        if found is None:
            return
        document = job_document(found)
