"""What an episode leaves behind and how it is read back: MLGym's ``.traj`` files (``trajectories``), the run's
provenance, the conversation, the kinds of observation, the clock its times are taken on, the starter files a
replay may rebuild (``recorded_files``), what a record may decide (``trust``) and readers that never block on what a
record holds (``regular_files``)."""
