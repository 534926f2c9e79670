"""What the supervisor serves besides the engine: its status, and a TCP way to the engine.

    server.py   /live, /ready, /status, /metrics and an HTML page on the status port; reads a
                snapshot per request, never changes state, redacts every body
    relay.py    a plain TCP relay from server.tcp_port to the engine's port (RunPod's HTTP proxy
                cuts a request at ~125 s; a TCP port is reached directly)
    listen.py   a port that cannot be bound said in one line (who holds it, which setting moves
                it); accept errors back off

Kept free of imports.
"""
