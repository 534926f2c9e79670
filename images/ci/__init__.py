"""CI: what .github/workflows/images.yml runs, as commands a person can run too (`python -m images.ci`).

    commands.py  matrix (the releasable targets), gate, promote: the workflow's steps
    gate.py      the selftest on a GPU (a self-hosted runner, or a RunPod pod from a staging template)
                 before anything is promoted
    promote.py   staging tags -> release tags, all or nothing, once every image passed
"""
