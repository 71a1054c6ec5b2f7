"""Scripts that launchers execute as ranks (each runnable on its own with ``--help``).

They are run as files (``torchrun helpers/scenarios/x.py``), so they import their
sibling ``_common`` module directly rather than through the ``helpers`` package.
"""
