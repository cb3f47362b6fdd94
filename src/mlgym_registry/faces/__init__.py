"""The envs as other libraries expect them: Gymnasium (``gymnasium``, ``gymnasium_registration``), OpenEnv
(``openenv``: the server; its client stays at ``mlgym_registry.client``, where OpenEnv's ``AutoEnv`` looks for it) and
verifiers (``verifiers``: ``load_environment``, found by ``vf-eval mlgym_registry.faces.verifiers``)."""
