"""Procedural ALFWorld games: PDDL problems for the six task types, checked by the planner.

ALFWorld's shipped games come from ALFRED's THOR scenes; training beyond them needs more.
A game file is plain JSON (`pddl_domain`, `grammar`, `pddl_problem`, `walkthrough`), so a
new game only needs a new problem. We use the engine's own domain (`ALFRED_PDDL_PATH`)
and grammar (`ALFRED_TWL2_PATH`, with the goal sentence filled in from ALFWorld's goal
library), ALFWorld's object/receptacle compatibility tables (`alfworld.gen.constants`) and
ALFRED's own room inventories (`alfworld/gen/layouts/FloorPlan<N>-objects.json` and
`-openable.json`: which object and receptacle classes a real room has, and how many of its
receptacles), so the commands, texts, rules and rooms are those of the real games.

Rooms come only from ALFRED's *training* floor plans (`constants.TRAIN_SCENE_NUMBERS`),
minus the four rooms of valid_unseen (10, 219, 308, 424): a generated train split never
shows the rooms the evaluation calls unseen.

Every candidate is loaded into the real engine: it is kept only if it is not already won
at reset and fast-downward finds a plan that, replayed step by step, wins it. The plan is
stored as the game's walkthrough (the expert follows it).

Objects are placed at random in compatible receptacles (ALFRED places them by physics),
and a scene holds 12-17 loose objects against valid_unseen's 50-70 (planning time grows
with them), so generated games are for training, never for reported numbers.

Generation is deterministic by seed and resumable: `<out>/make-games.json` records the
seed, the task types and every game written, after each game.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rollhub.core.errors import UserError
from rollhub.envs.alfworld.games import GAME_FILE, normalise_task_types

logger = logging.getLogger(__name__)

#: receptacle type -> (min, max) count, per kind of room
SCENES: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {
        "Cabinet": (3, 6),
        "CounterTop": (1, 3),
        "Drawer": (1, 3),
        "Fridge": (1, 1),
        "Microwave": (1, 1),
        "SinkBasin": (1, 1),
        "StoveBurner": (2, 4),
        "CoffeeMachine": (1, 1),
        "GarbageCan": (1, 1),
        "Toaster": (0, 1),
        "Shelf": (0, 3),
        "DiningTable": (0, 1),
    },
    "bedroom": {
        "Bed": (1, 1),
        "Desk": (1, 2),
        "Drawer": (2, 5),
        "Shelf": (1, 4),
        "SideTable": (0, 2),
        "Dresser": (0, 1),
        "GarbageCan": (1, 1),
        "Safe": (0, 1),
        "LaundryHamper": (0, 1),
        "ArmChair": (0, 1),
    },
    "livingroom": {
        "Sofa": (1, 1),
        "ArmChair": (0, 2),
        "CoffeeTable": (1, 1),
        "SideTable": (1, 2),
        "Drawer": (1, 3),
        "Shelf": (1, 3),
        "TVStand": (0, 1),
        "GarbageCan": (1, 1),
        "Dresser": (0, 1),
        "Cabinet": (0, 3),
        "Safe": (0, 1),
    },
}
SCENES["bathroom"] = {
    "Toilet": (1, 1),
    "SinkBasin": (1, 2),
    "BathtubBasin": (0, 1),
    "CounterTop": (1, 1),
    "Cabinet": (1, 4),
    "Drawer": (0, 4),
    "Shelf": (0, 2),
    "GarbageCan": (1, 1),
    "TowelHolder": (0, 1),
    "HandTowelHolder": (0, 1),
    "ToiletPaperHanger": (0, 1),
}
#: rooms where each task type can be set up (the appliance it needs lives in a kitchen)
TASK_SCENES = {
    "pick_and_place_simple": ("kitchen", "bedroom", "livingroom", "bathroom"),
    "look_at_obj_in_light": ("bedroom", "livingroom"),
    "pick_clean_then_place_in_recep": ("kitchen", "bathroom"),
    "pick_heat_then_place_in_recep": ("kitchen",),
    "pick_cool_then_place_in_recep": ("kitchen",),
    "pick_two_obj_and_place": ("kitchen", "bedroom", "livingroom", "bathroom"),
}
#: ALFRED's floor-plan numbering: hundreds digit -> room kind
FLOORPLAN_KINDS = {0: "kitchen", 2: "livingroom", 3: "bedroom", 4: "bathroom"}
#: the rooms of valid_unseen (the evaluation split): never used for generated games
UNSEEN_FLOORPLANS = (10, 219, 308, 424)
#: layout names -> the receptacle classes of the PDDL domain
LAYOUT_RECEPTACLE_NAMES = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}
#: receptacle classes that are also small movable objects: never rooms' fixed receptacles here
MOVABLE_RECEPTACLES = {"Bowl", "Cup", "Mug", "Pan", "Plate", "Pot", "Box", "Cart"}
#: the transformation each task needs: (VAL_ACTION_OBJECTS key, goal predicate)
TASK_TRANSFORM = {
    "pick_clean_then_place_in_recep": ("Cleanable", "isClean"),
    "pick_heat_then_place_in_recep": ("Heatable", "isHot"),
    "pick_cool_then_place_in_recep": ("Coolable", "isCool"),
}
#: the rtypes the domain's actions name as constants; a problem must declare them
DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
LAMP_RECEPTACLES = ("Desk", "SideTable", "Dresser")
#: classes that never appear as loose objects here (lamps are placed on purpose; boxes open)
EXCLUDED_OBJECTS = {"DeskLamp", "FloorLamp", "Box"}
MAX_PLAN_STEPS = 30


@dataclass
class Scene:
    """A room: receptacles with their locations, objects with their receptacles."""

    kind: str
    floorplan: int = 0  # the ALFRED room whose inventory this scene uses
    receptacles: list[tuple[str, str]] = field(default_factory=list)  # (pddl id, class)
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (pddl id, class, receptacle id)
    counts: dict[str, int] = field(default_factory=dict)

    def new_id(self, cls: str) -> str:
        self.counts[cls] = self.counts.get(cls, 0) + 1
        return f"{cls}_bar_{self.counts[cls]}"

    def add_receptacle(self, cls: str) -> str:
        if cls == "SinkBasin":  # the demangler names `Sink_bar_..._bar_SinkBasin` "sinkbasin N"
            self.counts["Sink"] = self.counts.get("Sink", 0) + 1
            rid = f"Sink_bar_{self.counts['Sink']}_bar_SinkBasin"
        else:
            rid = self.new_id(cls)
        self.receptacles.append((rid, cls))
        return rid

    def add_object(self, cls: str, receptacle_id: str) -> str:
        oid = self.new_id(cls)
        self.objects.append((oid, cls, receptacle_id))
        return oid

    def receptacle_classes(self) -> set[str]:
        return {cls for _, cls in self.receptacles}


@dataclass
class TaskSpec:
    task_type: str
    object_class: str
    receptacle_class: str = ""
    toggle_class: str = ""

    def pddl_params(self) -> dict[str, Any]:
        return {
            "object_target": self.object_class,
            "parent_target": self.receptacle_class,
            "toggle_target": self.toggle_class,
            "mrecep_target": "",
            "object_sliced": False,
        }


def _tables() -> tuple[dict[str, set[str]], dict[str, set[str]], set[str]]:
    from alfworld.gen import constants

    return constants.VAL_RECEPTACLE_OBJECTS, constants.VAL_ACTION_OBJECTS, set(constants.OPENABLE_CLASS_LIST)


def _valid_homes(scene: Scene, cls: str, holds: dict[str, set[str]], exclude_class: str = "") -> list[str]:
    return [rid for rid, rcls in scene.receptacles if cls in holds.get(rcls, ()) and rcls != exclude_class]


def floorplans(kind: str) -> list[int]:
    """ALFRED's training floor plans of one room kind, valid_unseen's rooms left out."""
    from alfworld.gen import constants

    return [
        n for n in constants.TRAIN_SCENE_NUMBERS if FLOORPLAN_KINDS.get(n // 100) == kind and n not in UNSEEN_FLOORPLANS
    ]


def room_inventory(floorplan: int) -> tuple[set[str], dict[str, int]]:
    """(object and receptacle classes present, receptacle counts) of one real ALFRED room."""
    import alfworld.gen

    layouts = Path(alfworld.gen.__file__).resolve().parent / "layouts"
    classes = set(json.loads((layouts / f"FloorPlan{floorplan}-objects.json").read_text()))
    counts: dict[str, int] = {}
    for key in json.loads((layouts / f"FloorPlan{floorplan}-openable.json").read_text()):
        cls = key.split("|", 1)[0]
        cls = LAYOUT_RECEPTACLE_NAMES.get(cls, cls)
        counts[cls] = counts.get(cls, 0) + 1
    return classes | set(counts), counts


def build_scene(task_type: str, rng: np.random.Generator) -> tuple[Scene, TaskSpec] | None:
    """Sample a real room and a task in it; None when this draw cannot host the task."""
    holds, actions, _ = _tables()
    kind = str(rng.choice(TASK_SCENES[task_type]))
    floorplan = int(rng.choice(floorplans(kind)))
    classes, counts = room_inventory(floorplan)
    scene = Scene(kind=kind, floorplan=floorplan)
    for cls, (low, high) in SCENES[kind].items():
        if cls in classes or low > 0:  # what the room has; what every room of the kind needs
            number = counts.get(cls) or int(rng.integers(max(low, 1), max(high, 1) + 1))
            for _ in range(min(number, 8)):
                scene.add_receptacle(cls)
    for cls in sorted(classes & set(holds) - set(SCENES[kind]) - MOVABLE_RECEPTACLES):
        scene.add_receptacle(cls)  # the room's other fixed receptacles (an Ottoman, a Safe)
    present = sorted(scene.receptacle_classes())
    loose = sorted(
        ({o for r in present for o in holds.get(r, ()) if not o.endswith("Sliced")} & classes) - EXCLUDED_OBJECTS
    )

    # the task: an object class and a target receptacle class that can hold it
    candidates = []
    for recep in present:
        for obj in sorted(holds.get(recep, ())):
            if obj not in loose or (recep in DOMAIN_RTYPES and task_type in TASK_TRANSFORM):
                continue
            if task_type in TASK_TRANSFORM and obj not in actions[TASK_TRANSFORM[task_type][0]]:
                continue
            if not _valid_homes(scene, obj, holds, exclude_class=recep):
                continue  # the object must start somewhere else
            candidates.append((obj, recep))
    if task_type == "look_at_obj_in_light":
        lamp_homes = [rid for rid, rcls in scene.receptacles if rcls in LAMP_RECEPTACLES]
        if "DeskLamp" not in classes:
            lamp_homes = []  # this room has no desk lamp
        objs = [o for o in loose if _valid_homes(scene, o, holds)]
        if not lamp_homes or not objs:
            return None
        task = TaskSpec(task_type, object_class=str(rng.choice(objs)), toggle_class="DeskLamp")
        scene.add_object("DeskLamp", str(rng.choice(lamp_homes)))
        homes = _valid_homes(scene, task.object_class, holds)
    else:
        if not candidates:
            return None
        obj, recep = candidates[int(rng.integers(len(candidates)))]
        task = TaskSpec(task_type, object_class=obj, receptacle_class=recep)
        homes = _valid_homes(scene, obj, holds, exclude_class=recep)
    copies = 2 if task_type == "pick_two_obj_and_place" else 1
    for _ in range(copies + int(rng.integers(0, 2))):
        scene.add_object(task.object_class, str(rng.choice(homes)))

    # distractors: no more instances of the target class, so the goal cannot hold at reset
    distractors = [
        o
        for o in loose
        if o != task.object_class and _valid_homes(scene, o, holds, exclude_class=task.receptacle_class)
    ]
    if not distractors:
        return None
    for _ in range(int(rng.integers(10, 15))):
        cls = str(rng.choice(distractors))
        scene.add_object(cls, str(rng.choice(_valid_homes(scene, cls, holds, exclude_class=task.receptacle_class))))
    return scene, task


def _goal(task: TaskSpec) -> str:
    if task.task_type == "look_at_obj_in_light":
        return (
            "(and (exists (?ot - object ?r - receptacle ?a - agent ?l - location) (and "
            f"(objectType ?ot {task.toggle_class}Type) (toggleable ?ot) (isToggled ?ot) (receptacleAtLocation ?r ?l) "
            "(atLocation ?a ?l) (inReceptacle ?ot ?r))) "
            f"(exists (?o - object ?a - agent) (and (objectType ?o {task.object_class}Type) (holds ?a ?o))))"
        )
    if task.task_type == "pick_two_obj_and_place":
        return (
            "(and (exists (?r - receptacle) (exists (?o1 - object) (and "
            f"(objectType ?o1 {task.object_class}Type) (receptacleType ?r {task.receptacle_class}Type) "
            "(inReceptacle ?o1 ?r) "
            "(exists (?o2 - object) (and (not (= ?o1 ?o2)) "
            f"(objectType ?o2 {task.object_class}Type) (receptacleType ?r {task.receptacle_class}Type) "
            "(inReceptacle ?o2 ?r)))))))"
        )
    condition = (
        f"(objectType ?o {task.object_class}Type) (receptacleType ?r {task.receptacle_class}Type) (inReceptacle ?o ?r)"
    )
    if task.task_type in TASK_TRANSFORM:
        condition += f" ({TASK_TRANSFORM[task.task_type][1]} ?o)"
    return f"(and (exists (?r - receptacle) (exists (?o - object) (and {condition}))))"


def problem_text(scene: Scene, task: TaskSpec, name: str) -> str:
    """The PDDL problem for a scene and task, in the shape of ALFWorld's own files."""
    holds, actions, openable = _tables()
    rclasses = sorted(scene.receptacle_classes() | set(DOMAIN_RTYPES))
    oclasses = sorted({cls for _, cls, _ in scene.objects})
    locations = {rid: f"loc_bar_{i + 1}" for i, (rid, _) in enumerate(scene.receptacles)}
    declared = ["agent1 - agent"]
    declared += [f"{cls}Type - otype" for cls in oclasses]
    declared += [f"{cls}Type - rtype" for cls in rclasses]
    declared += [f"{rid} - receptacle" for rid, _ in scene.receptacles]
    declared += ["loc_bar_0 - location"] + [f"{loc} - location" for loc in locations.values()]
    declared += [f"{oid} - object" for oid, _, _ in scene.objects]

    init = ["(atLocation agent1 loc_bar_0)"]
    for rid, cls in scene.receptacles:
        init.append(f"(receptacleType {rid} {cls}Type)")
        init.append(f"(receptacleAtLocation {rid} {locations[rid]})")
        if cls in openable:
            init.append(f"(openable {rid})")
    for rcls in rclasses:
        init += [f"(canContain {rcls}Type {ocls}Type)" for ocls in oclasses if ocls in holds.get(rcls, ())]
    for oid, cls, rid in scene.objects:
        init.append(f"(objectType {oid} {cls}Type)")
        init.append(f"(inReceptacle {oid} {rid})")
        init.append(f"(objectAtLocation {oid} {locations[rid]})")
        if cls in actions["Toggleable"]:
            init.append(f"(toggleable {oid})")
        else:
            init.append(f"(pickupable {oid})")
        for key, predicate in (
            ("Heatable", "heatable"),
            ("Coolable", "coolable"),
            ("Cleanable", "cleanable"),
            ("Sliceable", "sliceable"),
        ):
            if cls in actions[key]:
                init.append(f"({predicate} {oid})")
    body = "\n        ".join(init)
    objects = "\n        ".join(declared)
    return (
        f"(define (problem {name})\n(:domain alfred)\n(:objects\n        {objects}\n)\n"
        f"(:init\n        {body}\n)\n(:goal\n    {_goal(task)}\n)\n)\n"
    )


def goal_sentence(task: TaskSpec, rng: np.random.Generator) -> str:
    """ALFWorld's templated goal text (our rng, not the global one that alfworld uses)."""
    from alfworld.gen import goal_library

    templates = goal_library.gdict[task.task_type]["templates"]
    template = templates[int(rng.integers(len(templates)))]
    return template.format(
        obj=task.object_class.lower(), recep=task.receptacle_class.lower(), toggle=task.toggle_class.lower(), mrecep=""
    )


def game_data(scene: Scene, task: TaskSpec, name: str, rng: np.random.Generator) -> dict[str, Any]:
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    domain = Path(ALFRED_PDDL_PATH).read_text()
    grammar = Path(ALFRED_TWL2_PATH).read_text().replace("UNKNOWN GOAL", goal_sentence(task, rng))
    return {
        "pddl_domain": domain,
        "grammar": grammar,
        "pddl_problem": problem_text(scene, task, name),
        "solvable": True,
        "walkthrough": [],
    }


def solve(data: dict[str, Any]) -> list[str] | None:
    """The planner's winning command list, or None if the game is won at reset or unsolved."""
    from rollhub.envs.alfworld.engine import new_engine_env

    env = new_engine_env()
    env.load(data)
    state = env.reset()
    if state["won"]:
        return None
    inner = env
    while hasattr(inner, "_wrapped_env"):
        inner = inner._wrapped_env
    plan = list(inner._pddl_state.replan(inner._entity_infos))
    if not plan or len(plan) > MAX_PLAN_STEPS:
        return None
    for command in plan:
        if command not in state["admissible_commands"]:
            return None
        state, _, done = env.step(command)
    return plan if state["won"] else None


MANIFEST = "make-games.json"


@dataclass
class GenerationReport:
    written: list[Path]
    attempts: int
    rejected: dict[str, int]
    resumed: int = 0  # games found from an earlier run of the same command
    wall_s: float = 0.0


def _read_manifest(out: Path, seed: int, types: tuple[str, ...]) -> dict[str, Any] | None:
    """An earlier run's progress, when it used the same seed and task types (else a clear error)."""
    path = out / MANIFEST
    if not path.is_file():
        if out.is_dir() and any(out.rglob(GAME_FILE)):
            raise UserError(f"{out} already holds games not made by this command; choose an empty --out")
        return None
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        raise UserError(f"{path} is not valid JSON; delete it (and the games) to start over") from None
    if manifest.get("seed") != seed or tuple(manifest.get("task_types", ())) != types:
        raise UserError(
            f"{out} was made with seed {manifest.get('seed')} and task types {manifest.get('task_types')}; "
            "use those (to resume or add games) or another --out"
        )
    missing = [g for g in manifest["games"] if not (out / g / GAME_FILE).is_file()]
    if missing:
        raise UserError(f"{len(missing)} games listed in {path} are missing (e.g. {missing[0]}); delete {out}")
    return manifest


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    tmp = out / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(out / MANIFEST)  # atomic: a kill leaves the old or the new record, never half of one


def generate_games(
    n: int, out_dir: str | Path, task_types: list[int | str] | None = None, seed: int = 0, progress: bool = True
) -> GenerationReport:
    """Write `n` solvable games (task types round-robin) under `out_dir`.

    Game k is a function of (seed, task types, k) alone: a rerun resumes after the last
    recorded game, and `--n 600` after `--n 500` adds 100 games equal to those a direct
    `--n 600` makes.
    """
    import time

    from tqdm import tqdm

    from rollhub.envs.alfworld.engine import ensure_data_env

    started = time.perf_counter()
    ensure_data_env()
    types = normalise_task_types(task_types)
    out = Path(out_dir)
    manifest = _read_manifest(out, seed, types) or {
        "seed": seed,
        "task_types": list(types),
        "attempts": 0,
        "rejected": {"no_setup": 0, "won_at_reset_or_unsolved": 0},
        "games": [],
        "generator": "rollhub.envs.alfworld.generate (ALFRED training floor plans, planner-checked)",
    }
    resumed = len(manifest["games"])
    written = [out / g / GAME_FILE for g in manifest["games"][:n]]
    bar = tqdm(total=n, initial=min(resumed, n), desc="make-games", unit="game", disable=not progress)
    out.mkdir(parents=True, exist_ok=True)
    while len(written) < n:
        attempts = manifest["attempts"]
        if attempts > 20 * n + 20:
            raise RuntimeError(f"only {len(written)} of {n} games passed the planner after {attempts} attempts")
        task_type = types[len(written) % len(types)]
        rng = np.random.default_rng([seed, attempts])
        manifest["attempts"] = attempts + 1
        built = build_scene(task_type, rng)
        if built is None:
            manifest["rejected"]["no_setup"] += 1
            continue
        scene, task = built
        trial = f"trial_gen_s{seed}_{attempts:05d}"
        data = game_data(scene, task, f"plan_{trial}", rng)
        plan = solve(data)
        if plan is None:
            manifest["rejected"]["won_at_reset_or_unsolved"] += 1
            continue
        data["walkthrough"] = plan
        relative = (
            f"{task_type}-{task.object_class}-None-{task.receptacle_class or task.toggle_class}"
            f"-gen{scene.floorplan}/{trial}"
        )
        folder = out / relative
        folder.mkdir(parents=True, exist_ok=True)
        (folder / GAME_FILE).write_text(json.dumps(data))
        traj = {
            "task_id": trial,
            "task_type": task_type,
            "pddl_params": task.pddl_params(),
            "scene": {"kind": scene.kind, "floor_plan": scene.floorplan, "generator": "rollhub"},
        }
        (folder / "traj_data.json").write_text(json.dumps(traj, indent=1))
        written.append(folder / GAME_FILE)
        manifest["games"].append(relative)
        _write_manifest(out, manifest)
        bar.update(1)
    bar.close()
    if len(manifest["games"]) == resumed:
        _write_manifest(out, manifest)
    return GenerationReport(
        written=written,
        attempts=manifest["attempts"],
        rejected=dict(manifest["rejected"]),
        resumed=min(resumed, n),
        wall_s=time.perf_counter() - started,
    )
