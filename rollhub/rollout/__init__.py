"""rollhub.rollout: inference engines, the async env manager, trajectories, the sample buffer."""
