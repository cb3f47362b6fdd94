"""Sub-commands of ``mlgym-registry`` that run episodes: run, replay, check."""
