"""Our own task suite (task YAML, starter code, evaluators) and the MLGym-checkout task source."""
