"""Sokoban: procedural rooms by reverse play, an optimal solver and the text env."""

from rollhub.envs.sokoban.env import SokobanEnv, SokobanRewards
from rollhub.envs.sokoban.generator import GeneratedRoom, RoomGenerationError, generate_room
from rollhub.envs.sokoban.grid import Board
from rollhub.envs.sokoban.solver import solve

__all__ = ["Board", "GeneratedRoom", "RoomGenerationError", "SokobanEnv", "SokobanRewards", "generate_room", "solve"]
