"""Execution backends: ``local`` (embedded, container-free) and ``mlgym`` (the real MLGym, in containers)."""
