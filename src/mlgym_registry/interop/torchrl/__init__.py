"""TorchRL interop in one room: every use of TorchRL's and tensordict's internals, and everything that knows
TorchRL's pools and collectors exist.

- ``internals``: each internal relied on (a private name, a worker loop's argument, CPython's queue feeder), who
  relies on it, and a check that it still holds (``tests/interop/torchrl/test_internals.py``); the TorchRL and
  tensordict versions the package is tested with.
- ``hooks``: what happens as an env is built or an env factory is pickled (registered by the package's front door
  in ``env_hooks``); ``drivers``: which of TorchRL's pools or worker loops drives an env, told once as it is built.
- ``pools``: what a pool needs of the env's outputs (stacking, merging, closing); ``pool_wire``: what crosses a
  multiprocessing pool's queues.
- ``env_factory``: the picklable env factory; ``collectors``: TorchRL's multi-process collector over our envs;
  ``ray_collectors``: TorchRL's Ray collectors.

Importing this package (and ``hooks``) imports neither torch nor TorchRL.
"""
