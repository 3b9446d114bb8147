"""The Sokoban campaign: can RL add to a strong SFT warm-start on one small room? See README.md and LOG.md."""
