"""Model fetch from the Hub into the volume's cache: pinned, filtered, preflighted, parallel, resumable,
hashed while it downloads.

    repo + revision + allow_patterns ─▶ volume_lock.py  one download per model on a shared volume:
                                                     another worker's is waited for (/status says
                                                     whose), then its files are reused
                                     ─▶ plan.py      the files at that commit, model.entry checked,
                                                     a segment size
                                     ─▶ child.py     disk preflight (the bytes still missing against
                                                     the free space, refused before any byte)
                                     ─▶ download.py  every file's missing segments over
                                                     model.fetch_connections connections (default 32):
                                                     shards side by side, large files as ranges
                     HTTP range  ◀──┤  (http_source.py, huggingface_hub's http_get from the CDN URL)
                     Xet stream  ◀──┘  (xet_source.py, hf_xet, for files the Hub lists with a Xet hash)
                                     ─▶ sink.py      each segment's bytes in place in a sparse partial
                                     ─▶ journal.py   finished segments (+ CRC) in a sidecar, after fdatasync
                                     ─▶ hashing.py   the Hub's sha256 (or git oid) over segments in order
                                                     as they land; verified → the blob, linked
                                     ─▶ layout.py    huggingface_hub's cache layout, refs, manifests

A SIGKILL or a restarted container loses at most the segments in flight; a cut connection within
a running fetch loses at most one 256 KiB read (the segment resumes mid-way). Nothing here
ever deletes a complete blob: a moved branch or a changed ETag only adds a snapshot beside the
old one (llama.cpp deletes a cached 50 GB model when the ETag changes, llama.cpp#20005; a Hub 429
blocks a cached model there, #21677), and a complete cached copy serves when the Hub is away.

The download runs in a child process (`python -m supervisor.model.fetch`); `fetch()` (parent.py) takes
the volume's lock for the model (volume_lock.py; a holder that moves nothing on the volume for the
stall window is taken over), runs the child and enforces the stall deadline (no byte on any
connection for model.fetch_stall_s, counted from the lock in time the process could run: stall.py)
and stop requests.

Public surface: parent.fetch(cfg, env, *, token, should_stop, sleep, report, secrets, python) ->
FetchResult, raising FetchError or Cancelled (supervisor/errors.py); layout.cache_dir(cfg). The
loop reaches it through supervisor/run/fetch.py. Kept free of imports: the child process
(`python -m supervisor.model.fetch`, __main__.py) loads only what it runs.
"""
