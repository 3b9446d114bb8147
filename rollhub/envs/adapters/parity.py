"""Our Sokoban against GEM's, through the GEM adapter, on the same rooms.

`sokoban_parity` draws rooms from GEM (`gem:game:Sokoban-v0-*`), loads each into
rollhub/Sokoban-v0 as a hand-made level (`reset(options={"board": ...})`), plays the same random
moves in both, and counts agreement on what the rules share: the board after every move, which
moves are refused (a wall, or a box against a wall or box), and the step that solves the room.

Where they differ by design, not counted: rewards (GEM pays 1 at the solve and 0 otherwise, or
a share of boxes on target at its turn limit; ours is shaped or sparse), the end of an episode
(GEM ends at its turn limit with `terminated`; ours truncates at `max_steps`) and malformed
replies (GEM ends the episode; ours refuses the move and goes on; the adapter keeps ours).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

MOVES = ("up", "down", "left", "right")
# gym-sokoban's codes, shared by GEM and rollhub.envs.sokoban.grid: wall, floor, target, box on target, box, player
SYMBOLS = {0: "#", 1: "_", 2: "O", 3: "*", 4: "X", 5: "P", 6: "S"}


def gem_board(gem_env: Any) -> str:
    """GEM's room as text in our legend (player on a target is 'S', which GEM draws as 'P')."""
    fixed, state = gem_env.room_fixed, gem_env.room_state
    rows = []
    for r in range(fixed.shape[0]):
        row = ""
        for c in range(fixed.shape[1]):
            code = int(state[r, c])
            if code == 5:
                code = 6 if fixed[r, c] == 2 else 5
            elif code not in (3, 4):
                code = int(fixed[r, c])
            row += SYMBOLS[code]
        rows.append(row)
    return "\n".join(rows)


async def sokoban_parity(
    gem_id: str = "gem:game:Sokoban-v0-easy", rooms: int = 20, moves: int = 30, seed: int = 0
) -> dict[str, Any]:
    """Play `rooms` GEM rooms `moves` random moves each in both envs; returns the agreement counts."""
    from rollhub.envs.registry import make
    from rollhub.envs.sokoban.grid import Board

    rng = np.random.default_rng(seed)
    compared = boards_agree = refusals_agree = solves_agree = 0
    first_disagreement: str | None = None
    for room in range(rooms):
        gem = make(gem_id, max_turns=moves + 1, max_steps=moves + 1)
        ours = make("rollhub/Sokoban-Sparse-v0", max_steps=moves + 1)
        await gem.reset(seed=seed + room)
        level = gem_board(gem.gem_env)
        await ours.reset(options={"board": level})
        for _ in range(moves):
            move = MOVES[int(rng.integers(4))]
            before = gem_board(gem.gem_env)
            _, _, gem_done, _, _ = await gem.step(f"\\boxed{{{move}}}")
            _, _, our_done, _, info = await ours.step(f"<action>{move}</action>")
            after = gem_board(gem.gem_env)
            compared += 1
            same_board = Board.from_text(after).anchor() == ours.unwrapped.board.anchor()
            boards_agree += same_board
            refusals_agree += (after == before) == (not info["action_valid"])
            solves_agree += bool(gem_done) == bool(info["success"])
            if first_disagreement is None and not (same_board and (after == before) != info["action_valid"]):
                first_disagreement = f"room {room}, move {move} from\n{before}"
            if gem_done or our_done:
                break
        await gem.close()
        await ours.close()
    return {
        "gem_id": gem_id,
        "rooms": rooms,
        "moves_compared": compared,
        "board_agreement": boards_agree / compared,
        "refusal_agreement": refusals_agree / compared,
        "solve_agreement": solves_agree / compared,
        "first_disagreement": first_disagreement,
    }


if __name__ == "__main__":
    print(asyncio.run(sokoban_parity()))
