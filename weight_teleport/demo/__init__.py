"""The `weight-teleport demo` command: a disaggregated RL run on one CPU (`run.main`)."""
