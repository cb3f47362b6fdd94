"""One episode: a policy playing one env from reset to its end (``episode.run_episode``), and where an episode's files
go (``folders``). The rule that ends an episode after too many format errors is the chain's
(``transforms.episode_rules``)."""
