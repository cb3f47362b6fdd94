"""The envs as other libraries expect them: Gymnasium (``gymnasium``, ``gymnasium_registration``) and OpenEnv
(``openenv``: the server; its client stays at ``mlgym_registry.client``, where OpenEnv's ``AutoEnv`` looks for it)."""
