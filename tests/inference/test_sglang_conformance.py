"""Every body the client sends, checked against SGLang's own request classes, for the oldest and the
newest supported release (`SUPPORTED_SGLANG`). SGLang's `io_struct` imports torch, zmq and its
scheduler, so the classes are read from the wheels' source (fields, defaults, annotations), not
imported: no GPU stack needed. Get the wheels once (no dependencies, ~45 MB):

    for v in 0.5.6 0.5.23; do pip download --no-deps sglang==$v -d .cache/sglang-wheels; done

(or point ROLLHUB_SGLANG_WHEELS at a folder holding them); without them these tests skip.
"""

from __future__ import annotations

import ast
import json
import os
import tempfile
import zipfile
from pathlib import Path

import pytest

from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.sglang import SUPPORTED_SGLANG, SGLangEngine, SGLangError, parse_generate_reply
from tests.inference.sglang_stub import StubState, start_stub

ROOT = Path(__file__).resolve().parents[2]
WHEELS = Path(os.environ.get("ROLLHUB_SGLANG_WHEELS") or ROOT / ".cache" / "sglang-wheels")
FIXTURES = Path(__file__).parent / "data" / "sglang_replies.json"

#: endpoint -> the io_struct class SGLang parses its body into (same in every supported release)
REQUEST_CLASSES = {
    "/generate": "GenerateReqInput",
    "/update_weights_from_disk": "UpdateWeightFromDiskReqInput",
    "/init_weights_update_group": "InitWeightsUpdateGroupReqInput",
    "/update_weights_from_distributed": "UpdateWeightsFromDistributedReqInput",
    "/destroy_weights_update_group": "DestroyWeightsUpdateGroupReqInput",
    "/abort_request": "AbortReq",
    "/pause_generation": "PauseGenerationReqInput",
    "/continue_generation": "ContinueGenerationReqInput",
    "/update_weight_version": "UpdateWeightVersionReqInput",
    "/load_lora_adapter": "LoadLoRAAdapterReqInput",
    "/unload_lora_adapter": "UnloadLoRAAdapterReqInput",
}
#: the weight-update session, in the releases that have it (0.5.23 on)
SESSION_CLASSES = {
    "/begin_weight_update": "BeginWeightUpdateReqInput",
    "/end_weight_update": "EndWeightUpdateReqInput",
}
SESSION_RELEASES = ("0.5.23",)


def _wheel(version: str) -> Path | None:
    found = sorted(WHEELS.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def _source(wheel: Path, member: str) -> ast.Module:
    with zipfile.ZipFile(wheel) as archive:
        return ast.parse(archive.read(member).decode())


def _fields(module: ast.Module) -> dict[str, dict[str, tuple[str, bool]]]:
    """class -> field -> (annotation text, has a default), bases of the same module included."""
    classes = {node.name: node for node in module.body if isinstance(node, ast.ClassDef)}

    def of(name: str) -> dict[str, tuple[str, bool]]:
        node = classes[name]
        fields: dict[str, tuple[str, bool]] = {}
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in classes:
                fields |= of(base.id)
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                annotation = ast.unparse(item.annotation)
                if not annotation.startswith("ClassVar"):
                    fields[item.target.id] = (annotation, item.value is not None)
        return fields

    return {name: of(name) for name in classes}


def _init_args(module: ast.Module, class_name: str) -> dict[str, tuple[str, bool]]:
    """A class's keyword arguments: its `__init__`'s (0.5.6) or its struct fields (0.5.23)."""
    node = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return _fields(module)[class_name]
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + list(init.args.defaults)
    return {a.arg: (ast.unparse(a.annotation) if a.annotation else "", d is not None) for a, d in zip(args, defaults)}


_JSON_TYPES = {
    bool: ("bool",),
    int: ("int", "float"),
    float: ("float",),
    str: ("str",),
    list: ("List", "list", "Set"),
    dict: ("Dict", "dict"),
}


def _check(body: dict, fields: dict[str, tuple[str, bool]], what: str) -> None:
    unknown = set(body) - set(fields)
    assert not unknown, f"{what}: SGLang has no field(s) {sorted(unknown)}"
    missing = [name for name, (_, has_default) in fields.items() if not has_default and name not in body]
    assert not missing, f"{what}: SGLang requires {missing}"
    for key, value in body.items():
        annotation = fields[key][0]
        names = next((v for t, v in _JSON_TYPES.items() if type(value) is t), ())
        if "Literal[" in annotation:
            assert repr(value) in annotation, f"{what}.{key}={value!r} is not one of SGLang's {annotation}"
            continue
        assert value is None or any(n in annotation for n in names) or annotation in ("Any", ""), (
            f"{what}.{key}={value!r} does not fit SGLang's {annotation}"
        )


async def _client_bodies(release: str) -> list[tuple[str, dict]]:
    """Every request body the client sends, as a server of `release` receives it."""
    state = StubState(token_delay_s=0.0, release=release, enable_lora=True)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    adapter = tempfile.TemporaryDirectory()
    (Path(adapter.name) / "adapter_config.json").write_text(json.dumps({"r": 4, "target_modules": ["q_proj"]}))
    try:
        await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2, stop_token_ids=(7,), seed=5), "g-1-0")
        await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2, temperature=0.0, top_k=1))
        await client.pause()
        await client.resume()
        await client.abort("g-1-0")
        await client.abort_all()
        await client.update_weights_from_disk("/weights/v1", 1)
        with pytest.raises(Exception, match="stub has no rank"):
            await client.init_weights_update_group(
                master_address="127.0.0.1",
                master_port=29500,
                rank_offset=1,
                world_size=2,
                group_name="g",
                backend="nccl",
            )
        opened = await client.begin_weight_update()
        assert opened == (release in SESSION_RELEASES)
        await client.update_weights_from_distributed(
            names=["a", "b"], dtypes=["bfloat16", "float32"], shapes=[[2, 3], [4]], version=2, group_name="g"
        )
        if opened:
            await client.end_weight_update()
        await client.destroy_weights_update_group("g")
        await client.update_weight_version(3)
        await client.load_lora_adapter("rollhub-v4", adapter.name)
        client.lora_name = "rollhub-v4"
        await client.generate([1, 2, 3], SamplingParams(max_new_tokens=2))  # carries lora_path
        await client.unload_lora_adapter("rollhub-v4")
    finally:
        await client.close()
        await runner.cleanup()
        adapter.cleanup()
    return [(path, body) for path, body in state.calls if body is not None]


@pytest.mark.parametrize("version", SUPPORTED_SGLANG)
async def test_every_body_the_client_sends_fits_sglangs_request_classes(version):
    wheel = _wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang-{version} wheel in {WHEELS} (see this module's docstring)")
    structs = _fields(_source(wheel, "sglang/srt/managers/io_struct.py"))
    sampling = _init_args(_source(wheel, "sglang/srt/sampling/sampling_params.py"), "SamplingParams")
    bodies = await _client_bodies(version)
    classes = {**REQUEST_CLASSES, **(SESSION_CLASSES if version in SESSION_RELEASES else {})}
    assert {path for path, _ in bodies} == set(classes)  # every endpoint the client uses is checked
    for path, body in bodies:
        _check(body, structs[classes[path]], f"{version} {path}")
        if path == "/generate":
            _check(body["sampling_params"], sampling, f"{version} sampling_params")
    pause = next(body for path, body in bodies if path == "/pause_generation")
    assert pause["mode"] == "abort"


#: what the stub answers on the LoRA routes, as each release says it (module: its source)
LORA_MESSAGES = (
    "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.",
    "because it is already loaded",
    "is incompatible with the current",
    "does not exist. Loaded LoRAs",
    "Got LoRA adapter that has never been loaded",
    '"gate_proj": "gate_up_proj"',  # the target-module normalisation the stub applies
)


@pytest.mark.parametrize("version", SUPPORTED_SGLANG)
def test_the_stubs_lora_routes_and_messages_are_the_releases(version):
    """The LoRA routes the adapter push uses exist, and the stub's refusals are the release's own words."""
    wheel = _wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang-{version} wheel in {WHEELS} (see this module's docstring)")
    with zipfile.ZipFile(wheel) as archive:
        sources = {
            name: archive.read(name).decode(errors="replace")
            for name in archive.namelist()
            if name.startswith("sglang/srt/") and name.endswith(".py")
        }
    http = sources["sglang/srt/entrypoints/http_server.py"]
    assert '@app.api_route("/load_lora_adapter", methods=["POST"])' in http
    assert '@app.api_route("/unload_lora_adapter", methods=["POST"])' in http
    stub = (Path(__file__).parent / "sglang_stub.py").read_text()
    for message in LORA_MESSAGES:
        assert any(message in text for text in sources.values()), f"{version} no longer says {message!r}"
        assert message.replace('"', "") in stub.replace('"', "").replace("\n", ""), f"the stub does not say {message!r}"


@pytest.mark.parametrize("version", SUPPORTED_SGLANG)
def test_the_liveness_and_health_routes_are_what_the_watchdog_assumes(version):
    """`/ping` answered by the HTTP loop; `/health` the same handler as `/health_generate`."""
    wheel = _wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang-{version} wheel in {WHEELS} (see this module's docstring)")
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read("sglang/srt/entrypoints/http_server.py").decode()
    assert '@app.get("/health")\n@app.get("/health_generate")' in text
    assert '@app.get("/ping")' in text
    assert 'os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", 20)' in text


def test_recorded_replies_parse_to_generations():
    """Reply shapes of both releases (from their tokenizer manager's meta_info), parsed as the client does."""
    replies = json.loads(FIXTURES.read_text())
    for name, case in replies.items():
        generation = parse_generate_reply(case["reply"], "rid", 4, 3)
        assert generation.token_ids == case["token_ids"], name
        assert generation.finish_reason == case["finish_reason"], name
        expected = case.get("versions") or [case["version"]] * len(case["token_ids"])
        assert generation.token_versions == expected, name


@pytest.mark.parametrize("version", SUPPORTED_SGLANG)
def test_the_stub_follows_each_releases_weight_update_session_rules(version):
    """Read from the wheel: which releases have the session routes, and the scheduler's refusal of a
    distributed update outside one; the stub (and `rollhub serve`) answer with those same messages."""
    wheel = _wheel(version)
    if wheel is None:
        pytest.skip(f"no sglang-{version} wheel in {WHEELS} (see this module's docstring)")
    with zipfile.ZipFile(wheel) as archive:
        routes = archive.read("sglang/srt/entrypoints/http_server.py").decode()
        names = set(archive.namelist())
        updater_path = "sglang/srt/managers/scheduler_components/weight_updater.py"
        updater = archive.read(updater_path).decode() if updater_path in names else ""
    has_sessions = '@app.post("/begin_weight_update")' in routes
    assert has_sessions == (version in SESSION_RELEASES)
    assert ('@app.post("/end_weight_update")' in routes) == has_sessions
    if has_sessions:
        # the parser folds the implicit concatenations the messages are written with
        texts = {
            n.value for n in ast.walk(ast.parse(updater)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        stub_messages = (
            "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
            "a weight-update session is already open; call end_weight_update() first",
            "no weight-update session is open; call begin_weight_update() first",
        )
        for message in stub_messages:
            assert message in texts, message


@pytest.mark.parametrize("release", ["0.5.6", "0.5.23"])
async def test_a_distributed_update_outside_a_session_is_refused_where_the_release_says_so(release):
    state = StubState(token_delay_s=0.0, release=release)
    runner, url = await start_stub(state)
    client = SGLangEngine(url, api_key="")
    body = {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]], "version": 1, "group_name": "g"}
    try:
        if release in SESSION_RELEASES:
            with pytest.raises(SGLangError, match="must run between begin_weight_update"):
                await client.update_weights_from_distributed(**body)
            assert await client.begin_weight_update() is True
            await client.update_weights_from_distributed(**body)
            await client.end_weight_update()
            with pytest.raises(SGLangError, match="no weight-update session is open"):
                await client.end_weight_update()
            state.session_open = True  # a push that died with its session open: the next one reopens it
            assert await client.begin_weight_update() is True and state.session_open
        else:
            assert await client.begin_weight_update() is False and client.weight_update_sessions is False
            await client.update_weights_from_distributed(**body)
    finally:
        await client.close()
        await runner.cleanup()
