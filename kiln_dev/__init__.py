"""Kiln's development parts: stand-ins the tests run against. Never imported by supervisor/ or
images/ (the image ships without it), and it never imports tests/.

    runpod/     a stand-in for RunPod's REST API v2 and its HTTP proxy, pods running real supervisors
"""
