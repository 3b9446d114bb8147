"""An aiohttp server with the HTTP behaviour of SGLang (0.5.6 to 0.5.23) that the client depends on.

What it reproduces, read from SGLang's `srt/entrypoints/http_server.py` and `tokenizer_manager.py`:
* `/health` and `/health_generate` are one handler that submits a one-token generation and
  waits for it; while generation is paused nothing is generated, so the probe blocks and
  answers 503 after `health_timeout_s` (SGLang: SGLANG_HEALTH_CHECK_TIMEOUT, 20 s);
* `/ping` answers from the HTTP loop alone (200 while paused);
* `/pause_generation` (mode "abort") aborts in-flight requests, which return finish
  "abort"; new requests wait until `/continue_generation`;
* `/generate` refuses (400) a prompt of context_length tokens or more, and a prompt plus
  max_new_tokens that reaches the context length; its reply carries `meta_info.weight_version`
  as the server's version when the output is emitted;
* control endpoints answer `{"success", "message"}`, with 400 when `success` is False;
* the API key guards every path but those starting with /health (SGLang's middleware);
* per `release`: 0.5.23 has `/begin_weight_update` and `/end_weight_update` and refuses
  `/update_weights_from_distributed` (400) outside that session, with the messages of its
  scheduler's weight updater; 0.5.6 has neither route (404) and no session rule
  (tests/inference/test_sglang_conformance.py reads both rules from the wheels);
* LoRA (`tokenizer_communicator_mixin.py`, `lora_manager.py`, `lora_registry.py`, both releases):
  `/load_lora_adapter` answers 400 `{"success": false, "error_message"}` without --enable-lora, for
  a name already loaded, and for an adapter whose rank exceeds --max-lora-rank or whose target
  modules (normalised: q/k/v -> qkv_proj, gate/up -> gate_up_proj) are not among
  --lora-target-modules; it reads the adapter's adapter_config.json from `lora_path`;
  `/unload_lora_adapter` refuses a name not loaded; `/generate` with `lora_path` (an adapter's
  name) refuses one never loaded, and each reply records which adapter served it (`served_by`).
Only what cannot run here (a GPU model) is stubbed: tokens are a fixed sequence.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web


@dataclass
class StubState:
    context_length: int = 64
    health_timeout_s: float = 1.0
    token_delay_s: float = 0.01
    api_key: str | None = None
    weight_version: str = "default"
    fail_updates: bool = False
    update_delay_s: float = 0.0
    paused: bool = False
    hung: bool = False  # a wedged server: the port is open, nothing answers
    in_flight: int = 0
    most_in_flight: int = 0  # the most /generate requests it held at once
    resumed: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    calls: list[tuple[str, Any]] = field(default_factory=list)
    server_info: dict[str, Any] = field(default_factory=lambda: {"tp_size": 1, "dp_size": 1, "pp_size": 1})
    release: str = "0.5.23"  # whose weight-update rules it follows: "0.5.23" (sessions) or "0.5.6"
    session_open: bool = False
    # LoRA: --enable-lora, --max-lora-rank, --lora-target-modules (None = inferred from adapters)
    enable_lora: bool = False
    max_lora_rank: int = 64
    lora_target_modules: list[str] | None = None
    loras: dict[str, str] = field(default_factory=dict)  # loaded adapters: name -> lora_path
    served_by: list[str | None] = field(default_factory=list)  # the adapter name of each /generate, in order

    def __post_init__(self) -> None:
        self.resumed.set()


#: SGLang's names for the modules it stacks (`lora/utils.py` get_normalized_target_modules)
_NORMALISED = {
    "q_proj": "qkv_proj",
    "k_proj": "qkv_proj",
    "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj",
    "up_proj": "gate_up_proj",
}


def _control(success: bool, message: str) -> web.Response:
    return web.json_response({"success": success, "message": message}, status=200 if success else 400)


def make_app(state: StubState) -> web.Application:
    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        while state.hung:
            await asyncio.sleep(0.05)
        if state.api_key and not request.path.startswith("/health"):
            if request.headers.get("Authorization") != "Bearer " + state.api_key:
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def body_of(request: web.Request) -> Any:
        text = await request.text()
        body = json.loads(text) if text else {}
        state.calls.append((request.path, body))
        return body

    async def health(request: web.Request) -> web.Response:
        state.calls.append((request.path, None))
        try:  # the one-token generation waits for the scheduler, which does nothing while paused
            await asyncio.wait_for(state.resumed.wait(), timeout=state.health_timeout_s)
        except TimeoutError:
            return web.Response(status=503)
        await asyncio.sleep(state.token_delay_s)
        return web.Response(status=200)

    async def ping(request: web.Request) -> web.Response:
        state.calls.append((request.path, None))
        return web.Response(status=200)

    async def generate(request: web.Request) -> web.Response:
        body = await body_of(request)
        ids = body["input_ids"]
        params = body.get("sampling_params", {})
        max_new = int(params.get("max_new_tokens", 16))
        if len(ids) >= state.context_length:
            message = (
                f"The input ({len(ids)} tokens) is longer than the model's context length "
                f"({state.context_length} tokens)."
            )
            return web.json_response({"error": {"message": message}}, status=400)
        if len(ids) + max_new >= state.context_length:
            message = (
                "Requested token count exceeds the model's maximum context length of "
                f"{state.context_length} tokens. You requested a total of {len(ids) + max_new} tokens"
            )
            return web.json_response({"error": {"message": message}}, status=400)
        adapter = body.get("lora_path")
        if state.enable_lora and adapter is not None and adapter not in state.loras:
            message = (
                f"Got LoRA adapter that has never been loaded: {adapter}\nAll loaded adapters: {list(state.loras)}."
            )
            return web.json_response({"error": {"message": message}}, status=400)
        await state.resumed.wait()
        state.served_by.append(adapter if state.enable_lora else None)  # SGLang ignores it without --enable-lora
        state.in_flight += 1
        state.most_in_flight = max(state.most_in_flight, state.in_flight)
        try:
            return await _generate_tokens(body, ids, max_new)
        finally:
            state.in_flight -= 1

    async def _generate_tokens(body: dict, ids: list, max_new: int) -> web.Response:
        produced: list[list[Any]] = []
        finish: dict[str, Any] = {"type": "length", "length": max_new}
        aborted = state.aborted
        for k in range(max_new):
            if aborted.is_set():
                finish = {"type": "abort", "message": "Abort before prefill"}
                break
            await asyncio.sleep(state.token_delay_s)
            produced.append([-0.5, 100 + k, None])
        meta = {
            "id": body.get("rid"),
            "finish_reason": finish,
            "prompt_tokens": len(ids),
            "completion_tokens": len(produced),
            "cached_tokens": 0,
            "weight_version": state.weight_version,
            "e2e_latency": 0.01,
            "output_token_logprobs": produced,
        }
        return web.json_response({"text": "", "output_ids": [t[1] for t in produced], "meta_info": meta})

    async def pause(request: web.Request) -> web.Response:
        await body_of(request)
        state.paused = True
        state.resumed.clear()
        state.aborted.set()
        state.aborted = asyncio.Event()
        return web.json_response({"message": "Generation paused successfully."})

    async def resume(request: web.Request) -> web.Response:
        await body_of(request)
        state.paused = False
        state.resumed.set()
        return web.json_response({"message": "Generation continued successfully."})

    async def update_from_disk(request: web.Request) -> web.Response:
        body = await body_of(request)
        await asyncio.sleep(state.update_delay_s)
        if state.fail_updates:
            return _control(False, "Failed to update weights: stub refuses")
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
        return _control(True, "Succeeded to update model weights.")

    async def model_info(request: web.Request) -> web.Response:
        return web.json_response({"model_path": "stub", "is_generation": True, "weight_version": state.weight_version})

    async def weight_version(request: web.Request) -> web.Response:
        return web.json_response({"weight_version": state.weight_version})

    async def abort(request: web.Request) -> web.Response:
        await body_of(request)
        return web.Response(status=200)

    async def server_info(request: web.Request) -> web.Response:
        return web.json_response({**state.server_info, "version": "stub"})

    async def init_group(request: web.Request) -> web.Response:
        await body_of(request)  # recorded; the stub has no GPU rank to join with
        return _control(False, "Failed to init process group: stub has no rank to join")

    async def destroy_group(request: web.Request) -> web.Response:
        await body_of(request)
        return _control(True, "Succeeded to destroy custom process group.")

    async def begin_session(request: web.Request) -> web.Response:
        await body_of(request)
        if state.session_open:
            return _control(False, "a weight-update session is already open; call end_weight_update() first")
        state.session_open = True
        return _control(True, "Success")

    async def end_session(request: web.Request) -> web.Response:
        await body_of(request)
        if not state.session_open:
            return _control(False, "no weight-update session is open; call begin_weight_update() first")
        state.session_open = False
        return _control(True, "Success")

    async def update_distributed(request: web.Request) -> web.Response:
        body = await body_of(request)  # recorded; nothing to receive without a group
        if state.release != "0.5.6" and not state.session_open:
            return _control(
                False,
                "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()",
            )
        if body.get("weight_version") is not None:
            state.weight_version = str(body["weight_version"])
        return _control(True, "Succeeded to update parameter online.")

    async def update_version(request: web.Request) -> web.Response:
        body = await body_of(request)
        state.weight_version = str(body["new_version"])
        return web.json_response({"success": True, "message": "Weight version updated"})

    def lora_reply(success: bool, error: str | None = None) -> web.Response:
        body = {"success": success, "error_message": error, "loaded_adapters": dict(state.loras)}
        return web.json_response(body, status=200 if success else 400)

    async def load_lora(request: web.Request) -> web.Response:
        body = await body_of(request)
        name, path = body["lora_name"], body["lora_path"]
        if not state.enable_lora:
            return lora_reply(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if name in state.loras:
            return lora_reply(False, f"Failed to load LoRA adapter {name} because it is already loaded")
        try:
            config = json.loads((Path(path) / "adapter_config.json").read_text())
        except (OSError, ValueError) as exc:
            return lora_reply(False, f"Failed to load LoRA adapter {name}: {exc}")
        targets = {_NORMALISED.get(t.split(".")[-1], t.split(".")[-1]) for t in config["target_modules"]}
        allowed = None
        if state.lora_target_modules is not None:
            allowed = {_NORMALISED.get(t, t) for t in state.lora_target_modules}
        if int(config["r"]) > state.max_lora_rank or (allowed is not None and not targets <= allowed):
            return lora_reply(
                False,
                f"LoRA adapter {name} with rank {config['r']} is incompatible with the current LoRA memory pool "
                "configuration. Please ensure that the LoRA adapter's rank is within the configured "
                "`--max-lora-rank` and that the target modules are included in `--lora-target-modules`.",
            )
        state.loras[name] = path
        return lora_reply(True)

    async def unload_lora(request: web.Request) -> web.Response:
        body = await body_of(request)
        name = body["lora_name"]
        if not state.enable_lora:
            return lora_reply(False, "LoRA is not enabled. Please set `--enable-lora` to enable LoRA.")
        if name not in state.loras:
            return lora_reply(False, f"LoRA with name {name} does not exist. Loaded LoRAs: {list(state.loras)}")
        del state.loras[name]
        return lora_reply(True)

    app = web.Application(middlewares=[auth])
    app.router.add_post("/load_lora_adapter", load_lora)
    app.router.add_post("/unload_lora_adapter", unload_lora)
    app.router.add_post("/update_weights_from_distributed", update_distributed)
    if state.release != "0.5.6":
        app.router.add_post("/begin_weight_update", begin_session)
        app.router.add_post("/end_weight_update", end_session)
    app.router.add_post("/update_weight_version", update_version)
    app.router.add_get("/get_server_info", server_info)
    app.router.add_post("/init_weights_update_group", init_group)
    app.router.add_post("/destroy_weights_update_group", destroy_group)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health)
    app.router.add_get("/ping", ping)
    app.router.add_post("/generate", generate)
    app.router.add_post("/pause_generation", pause)
    app.router.add_post("/continue_generation", resume)
    app.router.add_post("/update_weights_from_disk", update_from_disk)
    app.router.add_get("/get_model_info", model_info)
    app.router.add_get("/get_weight_version", weight_version)
    app.router.add_post("/abort_request", abort)
    return app


async def start_stub(state: StubState) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(make_app(state))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"
