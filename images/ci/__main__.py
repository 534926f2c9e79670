"""`python -m images.ci COMMAND`: what .github/workflows/images.yml runs (images/ci/commands.py)."""

from .commands import main

raise SystemExit(main())
