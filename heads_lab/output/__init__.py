"""Where results go: trackers and the rich console (tracking.py), progress lines, tables,
figures, the head view, and the one way a file is written (files.py)."""
