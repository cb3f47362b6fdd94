"""Score the checkpoints of rlMetaMazeMisc as MLGym's evaluate.py does (see rl_gymnax.py):
MetaMaze-misc, 199 frames per rollout."""

import rl_gymnax

if __name__ == "__main__":
    rl_gymnax.main("MetaMaze-misc", max_frames=199)
