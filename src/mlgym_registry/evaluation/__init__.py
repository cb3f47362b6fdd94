"""Evaluating models over many runs: playing suites of runs, and MLGym's leaderboard tables (best and last scores,
ranks, AUP) over them.

- ``suite``: K runs of each task with one policy, in MLGym's layout (the ``bench`` command);
- ``runs``: finding MLGym-layout runs in folders and reading their ``results.json`` (and ``.traj`` exit status);
- ``tasks``: which metric ranks a task, in which direction, and the task's display name;
- ``metrics``: best/last scores, ranks, performance profiles and AUP, as pure functions over plain data;
- ``published``: MLGym's published tables found beside the runs, compared cell by cell with the report's;
- ``report``: the ``report`` command's output files (CSV tables, Markdown summary, PNG of the profiles).
"""
