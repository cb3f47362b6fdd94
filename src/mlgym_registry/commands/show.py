"""``mlgym-registry show FILE.traj``: print a recorded episode as a conversation.

The system and task messages, then every step's thought, action and observation, then how the episode ended
(``conversation.format_conversation``). Control characters in the recorded text are shown escaped.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import cli_integer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``show``."""
    parser.add_argument("traj", metavar="FILE.traj", help="a .traj file recorded by run, bench or MLGym")
    parser.add_argument("--max-chars", type=cli_integer(1), default=None, metavar="N",
                        help="show at most N characters of each message part, its head and tail (default: all)")


def main(args: argparse.Namespace) -> int:
    """Print the conversation of the ``.traj``."""
    from ..records.conversation import print_conversation
    from ..records.trajectories import load_recorded

    print_conversation(load_recorded(Path(args.traj)), max_chars=args.max_chars)
    return 0

