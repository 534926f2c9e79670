"""Deprecated: `python -m images.pods` is now `python build.py pods` (or `kiln pods`); this spelling
goes in the next release."""

if __name__ == "__main__":
    from .runpod.pods_cli import main

    raise SystemExit(main())
