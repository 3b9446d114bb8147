import numpy as np
import pytest

import rollhub.envs as envs
from rollhub.envs.sokoban.env import SYSTEM_PROMPT, SokobanEnv
from rollhub.envs.sokoban.grid import Board

LEVEL = """
######
#____#
#_XO_#
#_P__#
######
"""


async def play_expert(env, seed):
    obs, info = await env.reset(seed=seed)
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = await env.step(env.expert_action())
        total, steps = total + reward, steps + 1
        if terminated or truncated:
            return info["success"], steps, total


@pytest.mark.parametrize(
    "env_id,episodes",
    [
        ("rollhub/Sokoban-v0", 150),
        ("rollhub/Sokoban-Sparse-v0", 20),
        ("rollhub/Sokoban-6x6-2b-v0", 20),
        ("rollhub/Sokoban-8x8-2b-v0", 10),
    ],
)
async def test_expert_solves_every_generated_room(env_id, episodes):
    env = envs.make(env_id)
    for seed in range(episodes):
        success, steps, _ = await play_expert(env, seed)
        assert success, f"{env_id} seed {seed} not solved"
        assert steps <= env.max_steps


async def test_observation_is_the_compact_grid_every_turn():
    env = envs.make("rollhub/Sokoban-v0")
    obs, info = await env.reset(seed=5)
    assert [m["role"] for m in obs] == ["system", "user"]
    assert obs[0]["content"] == SYSTEM_PROMPT and "<action>up</action>" in SYSTEM_PROMPT
    grid = obs[1]["content"].splitlines()
    assert len(grid) == 6 and all(len(row) == 6 for row in grid)
    assert info["anchor"] == env.board.anchor()
    obs, *_ = await env.step(env.expert_action())
    assert len(obs) == 1 and len(obs[0]["content"].splitlines()) == 6


async def test_bare_answers_with_an_empty_action_tag():
    env = SokobanEnv(action_tag="")
    obs, _ = await env.reset(options={"board": LEVEL})
    assert "<action>" not in obs[0]["content"] and "up, down, left or right" in obs[0]["content"]
    _, _, _, _, info = await env.step(" left\n")  # player to (3,1)
    assert info["action_valid"]
    _, _, _, _, info = await env.step("<action>up</action>")  # a tagged answer is not a move here
    assert not info["action_valid"] and not info["format_ok"] and "not a move" in info["invalid_reason"]
    _, _, _, _, info = await env.step("")
    assert not info["format_ok"] and "answer like up" in info["invalid_reason"]
    assert env.expert_action() in ("up", "down", "left", "right")
    with pytest.raises(ValueError, match="action_tag"):
        SokobanEnv(action_tag="<action>")


async def test_end_on_deadlock_stops_the_episode_when_the_box_can_never_reach_a_target():
    for end in (True, False):
        env = SokobanEnv(end_on_deadlock=end, max_steps=10)
        await env.reset(options={"board": LEVEL})
        _, _, term, trunc, info = await env.step("<action>up</action>")  # box pushed against the top wall: dead
        assert term is end and not trunc and not info["success"] and info.get("deadlock", False) is end
    env = SokobanEnv(end_on_deadlock=True)
    await env.reset(options={"board": LEVEL})
    _, _, term, _, info = await env.step("<action>left</action>")  # a live move keeps playing
    assert not term and "deadlock" not in info


async def test_the_per_episode_dead_cell_table_decides_like_a_fresh_one():
    from rollhub.envs.sokoban.env import is_deadlocked
    from rollhub.envs.sokoban.solver import push_distances

    rng, seen = np.random.default_rng(0), {True: 0, False: 0}
    for seed in range(30):
        env = SokobanEnv(max_steps=15)
        await env.reset(seed=seed)
        live = push_distances(env.board)
        for _ in range(15):
            *_, terminated, truncated, _ = await env.step(env.random_action(rng))
            if terminated or truncated:
                break
            dead = is_deadlocked(env.board)
            assert is_deadlocked(env.board, live) is dead
            seen[dead] += 1
    assert seen[True] and seen[False]  # both outcomes were exercised


async def test_shaped_rewards_on_a_hand_made_level():
    env = SokobanEnv()
    await env.reset(options={"board": LEVEL})
    _, r, term, trunc, info = await env.step("<action>left</action>")  # player to (3,1)
    assert r == pytest.approx(-0.1) and info["action_valid"] and not term
    _, r, *_ = await env.step("<action>up</action>")  # player to (2,1), left of the box
    _, r, term, _, info = await env.step("<action>right</action>")  # box onto target: -0.1 + 1 + 10
    assert term and info["success"] and r == pytest.approx(10.9)


async def test_box_off_target_costs_one():
    env = SokobanEnv(max_steps=10)
    await env.reset(options={"board": "######\n#P*__#\n######"})
    _, r, term, _, info = await env.step("<action>right</action>")  # the box leaves its target
    assert r == pytest.approx(-1.1) and not term and info["boxes_on_target"] == 0 and not info["success"]


@pytest.mark.parametrize(
    "action,reason,format_ok",
    [
        ("I will go up", "no move found", False),
        ("<action>jump</action>", "'jump' is not a move", True),
        ("<action>down</action>", "wall", True),
    ],
)
async def test_invalid_action_leaves_state_and_says_why(action, reason, format_ok):
    env = SokobanEnv(max_steps=5)
    _, info = await env.reset(options={"board": LEVEL})
    before = info["anchor"]
    obs, r, term, trunc, info = await env.step(action)
    assert r == pytest.approx(-0.1) and not term and not trunc
    assert info["action_valid"] is False and info["format_ok"] is format_ok
    assert info["anchor"] == before and reason in info["invalid_reason"]
    assert obs[0]["content"].startswith("Invalid: ") and reason in obs[0]["content"]


async def test_box_into_wall_is_invalid():
    env = SokobanEnv()
    await env.reset(options={"board": "#####\n#PX_#\n#__O#\n#####"})
    await env.step("<action>right</action>")  # box to the right wall side
    _, _, _, _, info = await env.step("<action>right</action>")
    assert not info["action_valid"] and "into a wall" in info["invalid_reason"]


async def test_truncation_at_max_steps_and_step_after_end():
    env = SokobanEnv(max_steps=3)
    await env.reset(options={"board": LEVEL})
    results = [await env.step("<action>down</action>") for _ in range(3)]
    assert [r[3] for r in results] == [False, False, True]
    assert not any(r[2] for r in results)
    with pytest.raises(RuntimeError, match="reset"):
        await env.step("<action>up</action>")


async def test_sparse_reward_and_overrides():
    sparse = SokobanEnv(reward="sparse")
    await sparse.reset(options={"board": LEVEL})
    rewards = [
        (await sparse.step(a))[1] for a in ("<action>left</action>", "<action>up</action>", "<action>right</action>")
    ]
    assert rewards == [0.0, 0.0, 1.0]
    custom = SokobanEnv(step_reward=-0.5, invalid_reward=-2.0)
    await custom.reset(options={"board": LEVEL})
    assert (await custom.step("<action>left</action>"))[1] == -0.5
    assert (await custom.step("nonsense"))[1] == -2.0
    with pytest.raises(ValueError, match="sparse"):
        SokobanEnv(reward="dense")


async def test_seeded_resets_are_deterministic_and_unseeded_continue():
    a, b = SokobanEnv(), SokobanEnv()
    obs_a, info_a = await a.reset(seed=11)
    obs_b, info_b = await b.reset(seed=11)
    assert obs_a == obs_b and info_a["anchor"] == info_b["anchor"]
    rng_a, rng_b = np.random.default_rng(0), np.random.default_rng(0)
    for _ in range(10):
        ra = await a.step(a.random_action(rng_a))
        rb = await b.step(b.random_action(rng_b))
        assert ra == rb
        if ra[2] or ra[3]:
            break
    boards = {(await a.reset())[1]["anchor"] for _ in range(10)}
    assert len(boards) > 1


async def test_anchor_is_the_grid_codes():
    env = SokobanEnv()
    _, info = await env.reset(options={"board": LEVEL})
    codes = np.frombuffer(info["anchor"][2:], dtype=np.uint8).reshape(5, 6)
    assert codes[2, 2] == 4 and codes[2, 3] == 2 and codes[3, 2] == 5 and codes[0, 0] == 0
    assert Board.from_text(env.render_text()) == env.board


async def test_positions_observation_states_what_the_grid_shows():
    env = SokobanEnv(observation="grid+positions")
    obs, _ = await env.reset(options={"board": LEVEL})
    grid, line = obs[1]["content"].rsplit("\n", 1)
    assert grid == Board.from_text(LEVEL).render()
    # player (3,2); box (2,2) is straight up; target (2,3) is one right of the box
    assert line == "box up 1 col 0; target from box row 0 right 1; blocked down"
    obs, *_ = await env.step("<action>left</action>")  # player (3,1): box up 1 right 1, a wall below
    assert obs[0]["content"].endswith("box up 1 right 1; target from box row 0 right 1; blocked down left")
    with pytest.raises(ValueError, match="observation"):
        SokobanEnv(observation="pixels")


async def test_cells_observation_is_one_tokenizer_token_per_cell_inside_the_wall_ring():
    from rollhub.inference.models import build_tokenizer

    env = SokobanEnv(observation="cells+positions")
    obs, _ = await env.reset(options={"board": LEVEL})
    grid, line = obs[1]["content"].rsplit("\n", 1)
    # the outer ring is all wall and left out; every inner cell is " " + its symbol
    assert grid.split("\n") == [" _ _ _ _", " _ X O _", " _ P _ _"]
    assert line == "box up 1 col 0; target from box row 0 right 1; blocked down"
    tokens = build_tokenizer().tokenize(grid)
    assert len(tokens) == 3 * 4 + 2  # 12 cells and 2 newlines: the cell above is always 5 tokens back
    obs, _ = await SokobanEnv(observation="cells").reset(options={"board": LEVEL})
    assert obs[1]["content"] == grid


async def test_progress_reward_is_the_drop_in_solver_distance_and_telescopes():
    # LEVEL: the box is pushed right from (2,2) onto O by a player at (2,1): up-left first
    env = SokobanEnv(reward="sparse", progress_reward=0.5, max_steps=10)
    await env.reset(options={"board": LEVEL})
    start = env.distance_to_go(env.board)
    assert start == 3  # left, up, right
    _, r_away, *_ = await env.step("<action>down</action>")  # into the wall: rejected, no shaping
    assert r_away == 0.0
    _, r_right, *_ = await env.step("<action>right</action>")  # away from the box: one more move needed
    assert r_right == pytest.approx(-0.5)
    total = r_right
    while True:
        _, reward, terminated, truncated, info = await env.step(env.expert_action())
        total += reward
        if terminated or truncated:
            break
    assert info["success"]
    # telescoping: sum of shaping = k * (d(s_0) - d(s_T)) = 0.5 * 3, plus the sparse 1.0 for solving
    assert total == pytest.approx(1.0 + 0.5 * start)
    # clipping leaves a walk away priced as before (a walk changes d by at most one)
    clipped = SokobanEnv(reward="sparse", progress_reward=0.5, progress_clip=True, max_steps=10)
    await clipped.reset(options={"board": LEVEL})
    _, r_right, *_ = await clipped.step("<action>right</action>")
    assert r_right == pytest.approx(-0.5)


async def test_progress_reward_prices_a_dead_box_as_max_steps_plus_one():
    level = "\n".join(["######", "#____#", "#__X_#", "#O_P_#", "######"])
    env = SokobanEnv(reward="sparse", progress_reward=1.0, max_steps=10)
    await env.reset(options={"board": level})
    before = env.distance_to_go(env.board)
    _, reward, *_ = await env.step(
        "<action>up</action>"
    )  # the box goes against the top wall; the target is two rows down
    assert reward == pytest.approx(before - 11)  # dead: no plan, distance max_steps + 1
    assert before - 11 < -1  # so the clipped reading below differs from the unclipped one
    clipped = SokobanEnv(reward="sparse", progress_reward=1.0, progress_clip=True, max_steps=10)
    await clipped.reset(options={"board": level})
    _, reward, *_ = await clipped.step("<action>up</action>")
    assert reward == pytest.approx(-1.0)  # clipped: a dead push costs one move away
    _, r_left, *_ = await clipped.step("<action>left</action>")  # not ended (no end_on_deadlock): still dead
    assert r_left == pytest.approx(0.0)
    with pytest.raises(ValueError, match="progress_clip"):
        SokobanEnv(progress_reward=1.0, progress_clip="yes")
    with pytest.raises(ValueError, match="progress_reward"):
        SokobanEnv(progress_reward=-1.0)


@pytest.mark.parametrize("clip", [False, True])
async def test_a_dead_push_never_earns_a_reward_even_from_far_out(clip):
    # the box needs 7 moves, the episode allows 3: uncapped, d = 7 against dead = 4 paid +3
    level = "\n".join(["######", "#____#", "#__X_#", "#O_P_#", "######"])
    env = SokobanEnv(reward="sparse", progress_reward=1.0, progress_clip=clip, max_steps=3)
    await env.reset(options={"board": level})
    assert env.distance_to_go(env.board) == 3  # capped: no plan this long fits the episode
    _, reward, *_ = await env.step("<action>up</action>")  # box against the top wall: dead
    assert reward == pytest.approx(-1.0)


async def test_clipped_shaping_pays_nothing_for_a_loop():
    # pushing the box up costs 3 moves (the player must walk round to push it back down);
    # clipping that push to -k, as first built, paid +2k for every lap of the loop below
    level = "\n".join(["######", "##___#", "#____#", "#__X_#", "#O_P_#", "######"])
    lap = ["up", "right", "up", "up", "left", "down", "left", "down", "down", "right"]
    env = SokobanEnv(reward="sparse", progress_reward=1.0, progress_clip=True, action_tag="", max_steps=40)
    await env.reset(options={"board": level})
    start = env.board.anchor()
    for _ in range(3):
        rewards = [(await env.step(move))[1] for move in lap]
        assert env.board.anchor() == start
        assert rewards[0] == pytest.approx(-3.0)  # a live push keeps the potential's price
        assert sum(rewards) == pytest.approx(0.0)


@pytest.mark.parametrize("num_boxes,max_steps", [(1, 10), (2, 20)])
@pytest.mark.parametrize("clip", [False, True])
async def test_random_play_never_out_earns_solving(num_boxes, max_steps, clip):
    # adversarial check on the shaping: whatever the moves, an episode's total shaping is at
    # most k * d(s_0), reached only by solving, and every push into a dead position costs >= k
    rng = np.random.default_rng(0)
    env = SokobanEnv(
        num_boxes=num_boxes,
        max_steps=max_steps,
        reward="sparse",
        progress_reward=1.0,
        progress_clip=clip,
        end_on_deadlock=True,
        action_tag="",
    )
    deaths = 0
    for seed in range(40 if num_boxes == 1 else 10):
        await env.reset(seed=seed)
        best = env.distance_to_go(env.board)
        total = 0.0
        while True:
            _, reward, terminated, truncated, info = await env.step(str(rng.choice(["up", "down", "left", "right"])))
            shaping = reward - (1.0 if info["success"] else 0.0) if info["action_valid"] else 0.0
            total += shaping
            if info.get("deadlock"):
                deaths += 1
                assert shaping <= -1.0 + 1e-9
            if terminated or truncated:
                break
        assert total <= best + 1e-9
        assert info["success"] or total <= best - 1 + 1e-9
    assert deaths > 0  # the dead-push check above ran
