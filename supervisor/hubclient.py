"""What every Hub caller in the supervisor shares: the token, and what an error means.

All Hub traffic goes through huggingface_hub (model fetch, config polls, publish); this module
never talks to the Hub itself. The token comes from the environment (HF_TOKEN, or the older
HUGGING_FACE_HUB_TOKEN) or from a secret file ($KILN_HF_TOKEN_FILE, else /run/secrets/hf_token
when it exists); it is never printed: callers add it to the secrets every log line and /status
are masked with, and `describe()` keeps only an error's first line, which huggingface_hub builds
from the URL and the server's message, never from the request headers.
"""

from __future__ import annotations

import errno
import os
import urllib.parse
from pathlib import Path
from typing import Mapping

DEFAULT_TOKEN_FILE = "/run/secrets/hf_token"

# What an error means for the caller:
OFFLINE = "offline"          # no connection, DNS, timeout: use what is cached, try again later
UNAVAILABLE = "unavailable"  # 429 rate limit, 5xx: the same
NOT_FOUND = "not_found"      # repo, revision or file does not exist (or is hidden from this token)
AUTH = "auth"                # 401/403: the token is missing or wrong
OTHER = "other"

TRANSIENT = (OFFLINE, UNAVAILABLE)


def token(env: Mapping[str, str] | None = None) -> str | None:
    """The Hub token, or None (public repos need none)."""
    env = os.environ if env is None else env
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        value = (env.get(name) or "").strip()
        if value:
            return value
    path = env.get("KILN_HF_TOKEN_FILE") or DEFAULT_TOKEN_FILE
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return value or None


def token_or_file(token_file: str | None, env: Mapping[str, str] | None = None) -> str | None:
    """A command's --token-file when given (OSError when it cannot be read, or does not hold one
    token), else token(env)."""
    if token_file:
        try:
            value = Path(token_file).read_text(encoding="utf-8").strip()
        except UnicodeDecodeError:
            raise OSError(errno.EILSEQ, "it is not UTF-8 text (a Hub token is ASCII)", token_file) from None
        if len(value.split()) > 1:          # sent as it is, it would only be refused by the Hub, retried
            raise OSError(errno.EINVAL, "it holds more than one word (a Hub token is one, hf_...)", token_file)
        return value or None
    return token(env)


def endpoint_problem(env: Mapping[str, str] | None = None) -> str | None:
    """Why $HF_ENDPOINT cannot be a Hub's URL, or None (unset is the Hub itself): huggingface_hub
    reads it as it loads and a malformed one raises there, before any request could say so."""
    url = (os.environ if env is None else env).get("HF_ENDPOINT")
    if not url:
        return None
    try:
        u = urllib.parse.urlsplit(url)
        u.port                                  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        return f"HF_ENDPOINT {url!r} is not a URL ({e}): unset it for the Hub, or give a mirror's https URL"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"HF_ENDPOINT {url!r} is not an http(s) URL: unset it for the Hub, or give a mirror's https URL"
    return None


def error_kind(exc: BaseException) -> str:
    """OFFLINE, UNAVAILABLE, NOT_FOUND, AUTH or OTHER for an exception huggingface_hub raised."""
    from huggingface_hub import errors

    if isinstance(exc, errors.OfflineModeIsEnabled):
        return OFFLINE
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError, errors.EntryNotFoundError)):
        return NOT_FOUND
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return AUTH
        if status == 404:
            return NOT_FOUND
        if status == 429 or (isinstance(status, int) and status >= 500) or status == 408:
            return UNAVAILABLE
        return OTHER
    # httpx2's transport errors (connect, read, timeout, a cut stream) and the OS's own.
    name = type(exc).__name__
    if name.endswith(("ConnectError", "TimeoutException", "ReadTimeout", "ConnectTimeout", "RemoteProtocolError",
                      "NetworkError", "ReadError", "WriteError", "PoolTimeout", "TransportError")):
        return OFFLINE
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return OFFLINE
    return OTHER


def describe(exc: BaseException) -> str:
    """One line: the error's type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def outage_counted(st: dict, kind: str, why: str, interval_s: float) -> bool:
    """Count one failed request in a status record (errors, consecutive_errors, unreachable_since,
    last_error, interval_s: the watcher's and the reporter's); True when it starts an outage, which
    the caller logs once. The caller holds the record's lock."""
    import time

    st["errors"] += 1
    st["consecutive_errors"] += 1
    first = st["unreachable_since"] is None
    if first:
        st["unreachable_since"] = round(time.time(), 3)
    st.update(last_error=f"{kind}: {why}", interval_s=interval_s)
    return first


def outage_over(st: dict, interval_s: float) -> float | None:
    """A request succeeded: reset the record; how long the Hub had been away, if it was."""
    import time

    down = time.time() - st["unreachable_since"] if st["unreachable_since"] else None
    st.update(last_ok_at=round(time.time(), 3), consecutive_errors=0, unreachable_since=None, interval_s=interval_s)
    return down

