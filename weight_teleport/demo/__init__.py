"""The `weight-teleport demo` command: a disaggregated RL run on one CPU."""

from weight_teleport.demo.run import add_arguments, main

__all__ = ["add_arguments", "main"]
