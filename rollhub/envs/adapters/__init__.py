"""Environments written for other standards, seen as rollhub envs.

Each source has one module and one optional extra; an id names its source, and the registry
builds it on demand (`rollhub.envs.registry.SOURCES`):

    gem:game:Sokoban-v0-easy            a GEM id (extra `gem`)
    openenv:package.module:EnvClass     an OpenEnv `Environment` class, run in-process (extra `openenv`)
    openenv:ws://host:port              a running OpenEnv server, one WebSocket session per episode
    verifiers:package.module            a verifiers `load_environment()` (extra `verifiers`)
    harbor:/path/to/task                a Harbor task directory (instruction.md, task.toml, tests/test.sh)

The shared mapping rules live in `common`: anchors, infra vs model failures, truncation.
"""
