"""`python -m images.cli COMMAND`: the same CLI as `python build.py COMMAND` and `kiln COMMAND` (app.py)."""

from .app import main

raise SystemExit(main())
