"""Evaluating models over many runs: playing suites of runs, and MLGym's leaderboard tables (best and last scores,
ranks, AUP) over them; and the tasks' baselines those tables hold, scored as ``validate`` scores an agent's work.

- ``suite``: K runs of each task with one policy, in MLGym's layout (the ``bench`` command);
- ``runs``: finding MLGym-layout runs in folders and reading their ``results.json`` (and ``.traj`` exit status);
- ``tasks``: which metric ranks a task, in which direction, and the task's display name;
- ``metrics``: best/last scores, ranks, performance profiles and AUP, as pure functions over plain data;
- ``published``: MLGym's published tables found beside the runs, compared cell by cell with the report's;
- ``report``: the ``report`` command's output files (CSV tables, Markdown summary, PNG of the profiles);
- ``evaluator_runs``: a task's baseline program, scored in a fresh local-backend workspace by the pristine evaluator,
  and compared with the task's recorded baseline (``check`` and the integrity audit use it);
- ``baselines``: the script that recomputes the recorded baselines of our own suite from such runs.
"""
