"""Our ids work through gymnasium's own registry (a sync adapter drives the async env)."""

import gymnasium

import rollhub.envs  # noqa: F401  (registers the ids in gymnasium too)


def test_gymnasium_make_plays_sokoban_to_success():
    env = gymnasium.make("rollhub/Sokoban-v0")
    try:
        obs, info = env.reset(seed=3)
        assert obs[-1]["role"] == "user" and "P" in obs[-1]["content"]
        ours = env.unwrapped.env
        for _ in range(ours.max_steps):
            obs, reward, terminated, truncated, info = env.step(ours.expert_action())
            if terminated or truncated:
                break
        assert terminated and info["success"]
        assert "#" in env.render()
    finally:
        env.close()


def test_gymnasium_make_passes_kwargs_and_is_seeded():
    first = gymnasium.make("rollhub/Sokoban-v0", dim=7)
    second = gymnasium.make("rollhub/Sokoban-v0", dim=7)
    try:
        obs_a, info_a = first.reset(seed=9)
        obs_b, info_b = second.reset(seed=9)
        assert obs_a == obs_b and info_a["anchor"] == info_b["anchor"]
        assert len(obs_a[-1]["content"].splitlines()) == 7
    finally:
        first.close()
        second.close()


def test_math_through_gymnasium():
    env = gymnasium.make("rollhub/Math-v0", kinds=["arithmetic"], difficulty=1)
    try:
        env.reset(seed=0)
        _, reward, terminated, _, _ = env.step(env.unwrapped.env.expert_action())
        assert reward == 1.0 and terminated
    finally:
        env.close()
