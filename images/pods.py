"""Deprecated: `python -m images.pods ARGS` is `python build.py pods ARGS` (or `kiln pods ARGS`) now;
this spelling goes in the next release. Nothing imports this module; it only forwards."""

if __name__ == "__main__":
    import sys

    from .cli.app import main
    from .deprecated import notice

    notice("python -m images.pods", ["pods", *sys.argv[1:]])
    sys.exit(main(["pods", *sys.argv[1:]]))
