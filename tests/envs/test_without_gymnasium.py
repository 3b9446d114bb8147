"""rollhub's envs import and play without gymnasium installed (a bare GPU box carries no wheel it does
not need); gymnasium only adds `gymnasium.make` for the same ids."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLAY = """
import asyncio
import sys
sys.modules["gymnasium"] = None  # import gymnasium now raises ImportError, as where it is absent
from rollhub.envs import make

async def play():
    env = make("rollhub/Sokoban-v0")
    obs, info = await env.reset(seed=0)
    out = await env.step("<action>Up</action>")
    await env.close()
    return len(obs), len(out)

print(asyncio.run(play()))
"""


def test_envs_import_and_play_without_gymnasium():
    done = subprocess.run([sys.executable, "-c", PLAY], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("(")
