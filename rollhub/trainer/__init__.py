"""rollhub.trainer: advantages, losses, policy, the async training loop, weight sync."""
