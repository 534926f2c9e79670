"""The workstation's side of the router (engine = "router": smg in front of replicas, fed by their
readiness; the supervisor's side is supervisor/router/).

    local.py   python build.py router --replicas URL...: the supervised router here, in front of any
               OpenAI-compatible servers (a deploy config, then `python -m supervisor run` with it)
    pod.py     the router pod of `pods up --router`: its replicas' URLs, its environment, what
               `pods status` says it routes to

Import-free.
"""
