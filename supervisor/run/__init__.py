"""The shell: the loop and the bodies of its effects (see lifecycle/ for the decisions)."""
