"""`build.py upgrade`: a pinned engine moved to another version."""
