"""Score the checkpoints of rlBreakoutMinAtar as MLGym's evaluate.py does (see rl_gymnax.py):
Breakout-MinAtar, 999 frames per rollout."""

import rl_gymnax

if __name__ == "__main__":
    rl_gymnax.main("Breakout-MinAtar", max_frames=999)
