"""What ``tuner submit``, ``tuner jobs`` and ``tuner cancel`` call: the server's job routes over
HTTP, and nothing decided here (the server checks a job; its one-line refusal is the error).

    job = submit("http://127.0.0.1:8765", {"family": "attention", "trials": 50, "problems": [...]},
                 token=os.environ["TUNER_TOKEN"])
    print(jobs("http://127.0.0.1:8765")[0]["state"])
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from tuner.errors import TunerError, UsageError, first_line

DEFAULT_SERVER = "http://127.0.0.1:8765"
TIMEOUT_S = 30.0


def server_url(given: str | None) -> str:
    """``given``, else ``$TUNER_SERVER``, else the default address of ``tuner serve``."""
    url = given or os.environ.get("TUNER_SERVER") or DEFAULT_SERVER
    if urllib.parse.urlsplit(url).scheme not in ("http", "https"):
        raise UsageError(f"not a server URL: {url!r} (like {DEFAULT_SERVER})")
    return url.rstrip("/")


def submit(server: str | None, job: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    """Queue ``job`` (the body of ``POST /jobs``); the job as the server stored it."""
    return _call("POST", server, "/jobs", job, token)


def jobs(server: str | None, token: str | None = None) -> list[dict[str, Any]]:
    return _call("GET", server, "/jobs", None, token)


def job(server: str | None, job_id: int, token: str | None = None) -> dict[str, Any]:
    return _call("GET", server, f"/jobs/{job_id}", None, token)


def cancel(server: str | None, job_id: int, token: str | None = None) -> dict[str, Any]:
    return _call("DELETE", server, f"/jobs/{job_id}", None, token)


def _call(method: str, server: str | None, path: str, body: Any, token: str | None) -> Any:
    base = server_url(server)
    token = token or os.environ.get("TUNER_TOKEN")
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
            return json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise TunerError(f"{base}: {error.code}: {_detail(error)}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise TunerError(f"cannot reach {base}: {first_line(reason if isinstance(reason, BaseException) else error)}") from None


def _detail(error: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(error.read())["detail"])
    except (ValueError, KeyError, TypeError, OSError):
        return error.reason or "no detail"
