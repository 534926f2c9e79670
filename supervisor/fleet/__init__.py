"""The fleet, the pod's side: its record on the Hub, and a pod that can never serve going away.

    record.py          the shared vocabulary (also read by images/fleet/): where records live, the
                       record's fields, staleness, canary choice and assignment (stdlib only)
    reporter.py        this pod's record to the Hub: a thread the loop pokes, paced, masked
    self_terminate.py  [runpod] terminate_on_terminal_failure: FAILED for good -> the pod
                       terminates itself through RunPod's API after a grace
    cluster_terminate.py  the same on a cluster node: rank 0 finds its cluster by membership and
                       deletes it; other ranks leave it to rank 0

The publisher's side (publish-config, canary rollouts, fleet-status) runs on the workstation:
images/fleet/. Kept free of imports.
"""
