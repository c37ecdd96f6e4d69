"""edgespec desktop: a Qt (PySide6) chat app on the edgespec Python API, in-process (no server).

Run it from apps/desktop with `python -m edgespec_desktop [TARGET [DRAFT]]`.
"""
