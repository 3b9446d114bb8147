"""Registration of the built-in env ids (entry points import lazily on make)."""

from rollhub.envs.registry import register


def register_builtin_envs() -> None:
    # Each area adds its ids here; keep entry points as strings so nothing heavy imports.
    # Sokoban: default = the verl-agent / GiGPO setting; sized variants after RAGEN and GEM.
    sokoban = "rollhub.envs.sokoban.env:SokobanEnv"
    # the training-only difficulty floor is a wrapper: evaluation leaves it out
    sokoban_wrappers = {"min_solution_steps": "rollhub.envs.sokoban.env:with_min_solution_steps"}
    register(
        "rollhub/Sokoban-v0",
        sokoban,
        wrappers=sokoban_wrappers,
        description="Sokoban 6x6, 1 box, 15 moves, shaped reward",
        dim=6,
        num_boxes=1,
        max_steps=15,
        search_depth=30,
    )
    register(
        "rollhub/Sokoban-Sparse-v0",
        sokoban,
        wrappers=sokoban_wrappers,
        description="Sokoban 6x6, 1 box, 15 moves, 0/1 reward",
        dim=6,
        num_boxes=1,
        max_steps=15,
        search_depth=30,
        reward="sparse",
    )
    register(
        "rollhub/Sokoban-6x6-2b-v0",
        sokoban,
        wrappers=sokoban_wrappers,
        description="Sokoban 6x6, 2 boxes, 20 moves (GEM easy)",
        dim=6,
        num_boxes=2,
        max_steps=20,
        search_depth=300,
    )
    register(
        "rollhub/Sokoban-8x8-2b-v0",
        sokoban,
        wrappers=sokoban_wrappers,
        description="Sokoban 8x8, 2 boxes, 30 moves (RAGEN larger)",
        dim=8,
        num_boxes=2,
        max_steps=30,
        search_depth=100,
    )
    register(
        "rollhub/Sokoban-8x8-4b-v0",
        sokoban,
        wrappers=sokoban_wrappers,
        description="Sokoban 8x8, 4 boxes, 50 moves (GEM hard)",
        dim=8,
        num_boxes=4,
        max_steps=50,
        search_depth=300,
    )
    # Math: single-turn RLVR; pass dataset_path= for GSM8K/MATH-style jsonl.
    register(
        "rollhub/Math-v0",
        "rollhub.envs.math.env:MathEnv",
        description="single-turn math with verifiable answers (procedural or jsonl)",
    )
    # MathTool: multi-turn arithmetic with a python/calculator tool; backend=sandbox runs it in Docker.
    register(
        "rollhub/MathTool-v0",
        "rollhub.envs.mathtool.env:MathToolEnv",
        description="arithmetic a small model cannot do in its head, with a code tool (embedded or sandbox)",
    )
    # ALFWorld: real engine in worker processes; needs the 'alfworld' extra.
    register(
        "rollhub/ALFWorld-v0",
        "rollhub.envs.alfworld.env:ALFWorldEnv",
        description="ALFWorld household tasks, real TextWorld engine, 134 valid_unseen games, 50 steps",
        requires=("extra:alfworld",),
        extra="alfworld",
    )
    # SWE: swebench 5.x tasks in docker containers, graded by swebench; needs the 'swe' extra.
    register(
        "rollhub/SWE-v0",
        "rollhub.envs.swe.env:SWEEnv",
        description="fix real Python repos in containers (shipped factory tasks), swebench grading",
        requires=("docker",),
        extra="swe",
    )
    register(
        "rollhub/SWE-lite-v0",
        "rollhub.envs.swe.lite.env:SWELiteEnv",
        description="SWE-v0 on small generated projects with one bug each (`rollhub swe lite build`), split by content",
        requires=("docker", "file:~/.cache/rollhub/swe-lite/seed0/tasks.jsonl"),
        extra="swe",
    )
