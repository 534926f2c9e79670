"""The fleet, the publisher's side: configs published to the pods' Hub repo, and what the pods say.

    publish.py  `python build.py publish-config`: validate and lint, then upload (or a canary rollout)
    rollout.py  --canary N: choose live SERVING pods, commit to kiln-canary/<branch>, wait for their
                verdicts, promote the same bytes or stop with the cause; --wait for the whole fleet
    status.py   `python build.py fleet-status`: the records on kiln-fleet, a table, the commit budget
    probe.py    a Kiln supervisor's /status read from outside (CI's gate, `pods up`, `pods status`)

The record format is the pod's contract: supervisor/fleet/record.py.
"""
