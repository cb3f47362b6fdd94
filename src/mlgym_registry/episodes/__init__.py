"""One episode: a policy playing one env from reset to its end (``episode.run_episode``), the rules every episode
follows (``rules``: format errors, what ends an episode) and where an episode's files go (``folders``)."""
