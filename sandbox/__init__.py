"""rollhub.sandbox: containers and processes that code-running envs execute commands in."""
