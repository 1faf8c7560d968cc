"""The tokens of ``tuner serve``: made here, shown once, stored as the SHA-256 of their text.

    text = create_token("sqlite:///tuner.db", "write")   # give it to a client, it is not kept
    scope_of(repo, "Bearer " + text)                     # "write"; None for anything else

A write token also reads. Tokens are compared as digests with :func:`hmac.compare_digest`.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

from tuner import database
from tuner.errors import UsageError

SCOPES = ("read", "write")
PREFIX = "tkn_"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def create_token(db: str | None, scope: str, label: str | None = None) -> str:
    """A new token of ``scope`` stored (its digest) in ``db``; its text, which nothing keeps."""
    if scope not in SCOPES:
        raise UsageError(f"unknown scope {scope!r} (choose from {', '.join(SCOPES)})")
    text = PREFIX + secrets.token_urlsafe(32)
    with database.repository(database.url(db)) as repo:
        database.call(lambda: repo.add_token(digest(text), scope, label))
    return text


def scope_of(repo: Any, authorization: str | None) -> str | None:
    """The scope of the token an ``Authorization: Bearer ...`` header carries; None where it
    carries none, or one not stored."""
    if not authorization:
        return None
    kind, _, text = authorization.strip().partition(" ")
    if kind.lower() != "bearer" or not text.strip() or len(text) > 512:
        return None
    wanted = digest(text.strip())
    found = database.call(lambda: repo.token_scope(wanted))
    if found is None or not hmac.compare_digest(found[0], wanted):
        return None
    return found[1]


def allows(scope: str | None, needed: str) -> bool:
    """Whether a token of ``scope`` may do what needs ``needed`` (write reads too)."""
    return scope == needed or scope == "write"
