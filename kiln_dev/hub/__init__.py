"""A local stand-in for huggingface.co, for tests and benches.

Its parts: store.py (repos, refs, commits, blobs on disk), api.py (the routes below, as plain
request -> answer functions), server.py (the HTTP layer and `HubServer` with its knobs), client.py
(`client_env`, pointing the real client at it).

The public Hugging Face Hub cannot be reached from CI or from the sandboxes we test in, so tests run
the REAL ``huggingface_hub`` client against this server instead. It speaks the subset of the Hub's
HTTP protocol that ``huggingface_hub`` uses for repos, uploads and downloads, as read from the
installed client's source (huggingface_hub 2.4.0) and exercised by tests/integration/test_hubserver.py.
It is stdlib only: ``http.server.ThreadingHTTPServer``.

Routes (``{type}`` is ``models`` or ``datasets``; revisions are branch names, tag names or full
40-hex commit ids, URL-encoded as one path segment, so ``feat%2Fx`` is branch ``feat/x``)::

    GET    /api/whoami-v2                                  needs the token
    POST   /api/repos/create                               json name/organization/type/visibility|private; 409 if it exists
    DELETE /api/repos/delete                               json name/organization/type
    GET    /api/{type}/{ns}/{name}[/revision/{rev}]        id, sha, siblings, lastModified, ...; ?blobs=true adds size/blobId
    GET    /api/{type}/{ns}/{name}/refs                    branches, tags, converts, pullRequests
    GET    /api/{type}/{ns}/{name}/tree/{rev}[/{path}]     ?recursive=true; file and directory entries, one page
    GET    /api/{type}/{ns}/{name}/commits/{rev}           history, newest first, one page
    POST   /api/{type}/{ns}/{name}/paths-info/{rev}        form or json ``paths``; missing paths are left out
    POST   /api/{type}/{ns}/{name}/preupload/{rev}         uploadMode "regular" for every file (so no LFS, no Xet)
    POST   /api/{type}/{ns}/{name}/commit/{branch}         NDJSON: header, file (base64), deletedFile, deletedFolder
    POST   /api/{type}/{ns}/{name}/branch/{name}           json startingPoint (default: main); 409 if it exists
    DELETE /api/{type}/{ns}/{name}/branch/{name}
    POST   /api/{type}/{ns}/{name}/tag/{rev}               json tag (the name), message; 409 if it exists
    DELETE /api/{type}/{ns}/{name}/tag/{name}
    POST   /api/validate-yaml                              always valid (the client posts README.md here)
    GET    /api/agent-harnesses                            empty registry (fetched once per process when telemetry is on)
    GET|HEAD /{ns}/{name}/resolve/{rev}/{path}             file content; Range -> 206; LFS/Xet files: 302 to /cdn
    GET|HEAD /datasets/{ns}/{name}/resolve/{rev}/{path}
    GET|HEAD /cdn/{sha256}?expires={unix}                  the "CDN" (cdn-lfs / cas-bridge): Range -> 206; 403 once expired
    GET    /api/{type}/{ns}/{name}/xet-read-token/{rev}    Xet CAS url + access token, in X-Xet-* headers (and JSON)
    GET    /cas/v2/reconstructions/{xet_hash}              the Xet CAS (kiln_dev/hub/xetcas.py); Range -> part of the file
    GET    /cas/xorbs/{sha256}/{k}                         a xorb's framed chunks ("presigned": no token); Range -> 206
    POST   /v1/telemetry                                   hf_xet's transfer telemetry; accepted and dropped

Behaviour worth knowing:

* Storage is a directory: ``blobs/<sha256>`` holds each content once; ``repos/<type>/<ns>/<name>/``
  holds ``repo.json`` (privacy, branches, tags) and ``commits/<id>.json``, each an immutable snapshot
  ``{path: sha256}``. A new repo gets an initial commit with a ``.gitattributes``, as on the Hub.
  Commit ids are sha1 of (repo, sequence number, parent, files, title): 40 hex, never reused.
* A file is a regular git file unless it was seeded as LFS or Xet (``seed(..., storage=...)``):
  a regular file's oid (tree ``oid``, ``blobId``, ``ETag``) is the git blob sha1 of its content,
  which is also what the client compares to skip unchanged uploads. An LFS file is listed as the
  Hub lists one (``lfs: {oid: sha256, size, pointerSize}``, its oid the git sha1 of its pointer
  file) and its resolve URL answers 302 to the CDN route with ``X-Linked-Etag`` (the sha256) and
  ``X-Linked-Size``, on another origin (``localhost`` instead of ``127.0.0.1``, same port) so the
  client treats it as off-Hub, as it does cdn-lfs.hf.co. A Xet file is an LFS file that also has a
  ``xetHash`` in listings and ``X-Xet-Hash`` + a ``Link: <...xet-read-token...>; rel="xet-auth"``
  header on resolve, as on the Hub; ``hf_xet`` then downloads it from the CAS routes. Uploads are
  always regular (preupload says so), so LFS and Xet files only come from ``seed``.
* URLs the server hands out (CDN, CAS, xorbs) are built from the request's ``Host`` header, so a
  client that talks through a relay (kiln_dev/throttle.py) keeps talking through it.
* Auth: ``Authorization: Bearer <token>``. Private repos and all writes need the token; a wrong
  token gets 401 "Invalid credentials in Authorization header" on any route. Any namespace may be
  written with the token. The token is never logged (request logging is off).
* Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound) and
  ``X-Error-Message`` so the client raises its typed errors. A missing or hidden repo answers 401
  without a token and 404 with one.
* Not implemented: pull requests (``create_pr`` is refused with 400), LFS/Xet uploads, Spaces,
  pagination (every listing is one page), ``expand`` on tree/paths-info.

Knobs for tests: ``fail_next(n, status, path_prefix)`` answers the next n matching requests with
that status; ``truncate_next_download(after_bytes)`` cuts the next file body short (the client then
resumes with a Range request); ``set_offline(True)`` closes the listening socket and every open
connection so the client gets connection errors, as with no network, and ``set_offline(False)``
listens again on the same port; ``after_answer(method, path_prefix, callback)`` calls callback once,
right after the first matching request was answered (go offline just after a commit landed: the
client got its answer, the next request finds no Hub); ``counts`` counts requests per route name (``repo_info``,
``resolve_head``, ``resolve_get``, ``cdn_get``, ``xorb_get``, ``tree``, ...) and ``log`` records each
one; ``bytes_served`` counts the body bytes sent per route (what a download really cost).
``corrupt_next_download(at)`` flips one byte of the next file body; ``cdn_ttl_s`` is how long a
CDN URL stays valid (an hour, as a presigned URL might; tests shorten it). To arrange a test
without HTTP, ``seed(repo_id, {path: bytes}, storage="regular"|"lfs"|"xet")`` commits files
directly, ``seed_sparse(repo_id, path, size)`` commits a sparse LFS file of zeros of any size
(its sha256 is declared, not computed: a test never downloads it whole), and
``resolve(repo_id, rev)`` reads a ref.

Point the client at the server with ``client_env(server, home)``: huggingface_hub reads HF_ENDPOINT,
HF_HUB_CACHE, HF_HOME... once, at import, into ``huggingface_hub.constants`` (and the module-level
functions such as ``huggingface_hub.model_info`` are bound to an ``HfApi()`` built at import), so
setting environment variables in a running test is not enough. ``client_env`` sets the variables
(for subprocesses) and patches those import-time copies, and restores both on exit.
"""

from __future__ import annotations

from .client import ClientEnv, client_env
from .server import TEST_TOKEN, TEST_USER, HubServer, RequestRecord
from .store import RepoKey

__all__ = ["TEST_TOKEN", "TEST_USER", "ClientEnv", "HubServer", "RepoKey", "RequestRecord", "client_env"]
