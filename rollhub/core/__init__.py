"""rollhub.core: typed configuration and the errors a user can cause; imports nothing else of rollhub."""
