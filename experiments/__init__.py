"""Research campaigns run on rollhub: their tools, logs and results. `rollhub` never imports this package."""
