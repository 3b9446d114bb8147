"""The agent's side of the SWE env: the tools it calls in its container (`tools`) and
mini-swe-agent's environment on the same sandbox (`mini_swe_agent`)."""
