"""Hot reload: a published config replaces the running one, or is refused with the server untouched.

    watch.py      finds candidates: a Hub branch polled (and its canary branch), a local directory
                  watched; reports them to the loop (wake) and never decides
    candidate.py  a Candidate, and CandidateCheck: size, UTF-8, schema, boot-only tables, engine,
                  lint, [hardware], model, all checked while the server keeps serving
    book.py       what reload must not lose, in the volume: last good config, history, seen
                  markers, the last rejected bytes

The decision (reject, unchanged, fetch its model first, apply) is lifecycle/reload.py's, the book
through one run (boot from last good, check a candidate, record a decision, mark good) run/reload.py's:

    watcher -> candidate -> run/reload.py check -> CandidateChecked -> machine (lifecycle/reload.py
      decide) -> RELOADING
      -> the new ladder -> SERVING (MarkGood, RecordReload "applied")  |  ROLLBACK -> last good

Kept free of imports.
"""
