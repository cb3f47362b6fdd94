"""Score the checkpoints of rlMountainCarContinuousReinforce as MLGym's evaluate.py does (see rl_gymnax.py):
MountainCarContinuous-v0, 200 frames per rollout."""

import rl_gymnax

if __name__ == "__main__":
    rl_gymnax.main("MountainCarContinuous-v0", max_frames=200)
