"""ALFWorld (text) on the real ALFWorld/TextWorld engine: `rollhub/ALFWorld-v0`.

Import-light on purpose: the engine (textworld, fast-downward) is imported only inside the
worker processes, so listing envs or parsing CLI arguments never loads it.
"""
