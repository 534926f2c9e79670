"""The workstation's command line: `python build.py COMMAND` (build.py) and `kiln COMMAND` (the console
script `pip install -e .` installs): one parser, every workstation command. Import-free.

    app.py        the table of commands, the parser, main() (errors as one line, exit 2), `kiln`
    __main__.py   `python -m images.cli COMMAND` (what old spellings forward to)
    command.py    how a command is declared (Command), the options several commands share
    image.py      build, render, list, tag
    pins.py       lock
    upgrade.py    upgrade (what it does: images/upgrade/engine.py)
    binaries.py   compile, publish-binaries, rebuild-binaries
    compare.py    compare-images
    runpod.py     template
    pods.py       pods up|status|logs|down|volumes
    endpoint.py   endpoint plan|up|status|logs|down (RunPod Serverless load-balancing endpoints)
    fleet.py      publish-config, fleet-status
    router.py     router: the supervised router in front of replicas, here
    generate.py   generate [--check]: every committed generated file (what they are: images/generate/families.py)
    reference.py  docs/cli.md, generated from the parsers' --help

Each command module holds arguments and wiring only; what a command does lives in the package of
its concept (images/build, pins, binaries, runpod, fleet, router).
"""
