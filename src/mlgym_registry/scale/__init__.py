"""Many envs at once, on real engines: the one runner interface (``runs.run_episodes``, and ``runs.run_parallel``)
and its two engines, worker processes on one machine (``process_episodes``, over ``workers``' pool, sending numbered
``frames`` that the ``frame_receiver`` puts back in order) and Ray across machines (``ray_episodes``, ``ray_runtime``,
and ``ray_resources``: what an actor may ask of the cluster). TorchRL's own collectors and pools over many envs, and
the picklable env factory, are in ``interop/torchrl``."""
