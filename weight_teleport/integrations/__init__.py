"""Plugs for RL frameworks: their trainers' weight sync through weight-teleport."""
