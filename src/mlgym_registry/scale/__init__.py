"""Many envs at once, on real engines: the one runner interface (``runs.run_episodes``) and its two engines, worker
processes on one machine (``process_episodes``, over ``workers``' pool, sending numbered ``frames`` that the
``frame_receiver`` puts back in order) and Ray across machines (``ray_episodes``, ``ray_collectors``,
``ray_runtime``); TorchRL's own collectors over many envs (``parallel``); and the picklable env factory
(``env_factory``) that every process-based driver builds its envs with."""
