"""Processes: what PID 1 owes its children, and a stop that leaves nothing behind.

    pid1.py       signals relayed to the loop (the handler only records), orphans adopted and
                  reaped, the exit status of the child (or 128+N)
    managed.py    one server process: its own session and group, merged output with a tail kept
                  (how an OOM is recognised), a stop that signals the group, waits the grace,
                  kills, reaps, and finds descendants that escaped the group; REGISTRY of them all
    leftovers.py  every child recorded in the volume (ChildrenJournal), so the next supervisor ends
                  what a killed one left running before it starts anything

Kept free of imports.
"""
