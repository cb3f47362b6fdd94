"""Files the local backend installs into its shell sessions (bash tools, the edit helper, command docs)."""
