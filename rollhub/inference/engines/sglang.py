"""SGLangEngine: an InferenceEngine that speaks SGLang's native HTTP API over aiohttp.

Works against a real SGLang server (`python -m sglang.launch_server`, launched here or
reached by URL) and against `rollhub serve`. Only the fields we need are sent and
unknown response keys are ignored, because SGLang's schema drifts between releases.

Versions come from the server: its reply's `meta_info.weight_version` is the version its
weights had when the output was emitted. The manager's protocol is pause (in-flight requests
return "abort" with their partial output) -> update -> resume, and every resubmitted segment
is a new request, so no reply spans two versions and the server's label is exact -- also for
a request sent before a pause that reached the server after the update, which a label taken
by the client at submit would get wrong. A server that reports no numeric version (SGLang's
"default" before the first push) gets the client's version at submit.

Authentication: with an API key (given, or ROLLHUB_API_KEY) every request carries
`Authorization: Bearer <key>`, which both `rollhub serve` and SGLang's `--api-key` check.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollhub.inference.engines.base import Generation, InferenceEngine, SamplingParams

logger = logging.getLogger(__name__)

#: the SGLang releases whose request schema and HTTP behaviour the client is checked against
#: (tests/inference/test_sglang_conformance.py reads their wheels)
SUPPORTED_SGLANG = ("0.5.6", "0.5.23")
API_KEY_ENV = "ROLLHUB_API_KEY"  # the same variable `rollhub serve` reads


def resolve_api_key(api_key: str | None) -> str | None:
    """An explicit key wins (an empty one disables auth); else ROLLHUB_API_KEY, if set."""
    key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
    return key or None


class SGLangError(RuntimeError):
    """The server answered with an error (its HTTP `status`) or could not be reached (status None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class LogprobMode:
    """How a server reports behaviour log-probs (`SGLangEngine.probe_logprob_mode`); None = undecided.

    temperature_scaled: log_softmax(logits / T); False under SGLang's SGLANG_RETURN_ORIGINAL_LOGPROB,
        which reports T = 1 log-probs whatever T sampled, so pi / mu is off by the temperature.
    renormalised: top-k / top-p log-probs are those of the kept set (rollhub serve), not the tempered
        softmax before truncation (SGLang), which is not the probability the token was drawn with.
    """

    temperature_scaled: bool | None
    renormalised: bool | None


PROBE_TEMPERATURE = 0.5  # the second temperature of the probe: far enough from 1 to move any log-prob


def logprob_mode(top1: tuple[Generation, Generation], sampled: list[tuple[Generation, Generation]]) -> LogprobMode:
    """Decide the mode from the probe's replies: `top1` = one token at top_k 1 at T = 1 and at
    PROBE_TEMPERATURE (both the argmax); `sampled` = pairs at those temperatures at top_k 2, with a
    common seed.

    At top_k 1 a renormalising server reports log 1 = 0; one that reports before truncation gives
    log_softmax(z / T)[argmax] < 0, which moves with T unless the server ignores T. Where the argmax
    pair cannot tell (renormalised, or a one-hot distribution), a top_k 2 pair that drew the same
    token at both temperatures does: its log-prob within the two kept tokens moves with T too.
    """
    (a, b), tol = top1, 1e-5
    renormalised: bool | None = None
    temperature_scaled: bool | None = None
    if a.token_ids and b.token_ids and a.token_ids[0] == b.token_ids[0]:
        la, lb = a.logprobs[0], b.logprobs[0]
        if abs(la) < tol and abs(lb) < tol:
            renormalised = True
        elif abs(lb) > tol:  # at T = 0.5 the argmax has p < 1, so the report is not of the kept set
            renormalised = False
            temperature_scaled = abs(la - lb) > tol
    if temperature_scaled is None:
        for x, y in sampled:
            if x.token_ids and y.token_ids and x.token_ids[0] == y.token_ids[0] and abs(x.logprobs[0]) > tol:
                temperature_scaled = abs(x.logprobs[0] - y.logprobs[0]) > tol
                break
    return LogprobMode(temperature_scaled, renormalised)


def sglang_command(
    model_path: str,
    *,
    host: str,
    port: int,
    api_key: str | None,
    dtype: str = "bfloat16",
    python: str | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    """`python -m sglang.launch_server ...` with an explicit `--dtype`: SGLang's default `auto`
    serves a float32 checkpoint (rollhub's own are) in float16, silently."""
    if dtype not in ("bfloat16", "float16", "float32"):
        raise ValueError(f"dtype must be bfloat16, float16 or float32 (never auto), got {dtype!r}")
    return [
        python or sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        *(["--api-key", api_key] if api_key else []),
        *(extra_args or []),
    ]


class SGLangEngine(InferenceEngine):
    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 3600.0,
        process: subprocess.Popen | None = None,
        api_key: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._api_key = resolve_api_key(api_key)
        self.weight_version = 0
        self.weight_update_sessions: bool | None = None  # the release has /begin_weight_update; None = not asked yet
        self._process = process
        self._session: Any = None
        self._closed = False
        self._in_flight: set[str] = set()
        self.log_path: Path | None = None  # where a launched server logs
        self.tp_size: int | None = None  # ranks the server brings to a weight update group; None = ask it
        self.context_length: int | None = None  # prompt + new tokens it serves; None = learn from its refusals
        # the LoRA adapter requests are served with (engine.weight_sync lora_adapter); None = the base weights
        self.lora_name: str | None = None

    # --- construction ----------------------------------------------------------------

    @classmethod
    async def launch(
        cls,
        model_path: str,
        *,
        port: int = 30000,
        host: str = "127.0.0.1",
        command: list[str] | None = None,
        startup_timeout_s: float = 600.0,
        extra_args: list[str] | None = None,
        api_key: str | None = None,
        log_path: str | Path | None = None,
        dtype: str = "bfloat16",
        python: str | None = None,
    ) -> SGLangEngine:
        """Start a server process and wait for /health. Default: `python -m sglang.launch_server`
        (`sglang_command`: `python` is the server venv's interpreter, `dtype` always explicit).

        `command` replaces the launcher, e.g. `["rollhub", "serve", "--model", DIR, "--port", "P"]`.
        `api_key` (default ROLLHUB_API_KEY, else a fresh random key) reaches SGLang as `--api-key`
        and any other command as ROLLHUB_API_KEY in its environment; the client then sends it.
        The server's stdout and stderr go to `log_path` (default: a temporary file), never to
        a pipe: a pipe nobody reads fills up and then blocks the server mid-write.
        """
        # a key only this launch knows (`rollhub serve` would otherwise make one the client cannot read)
        api_key = resolve_api_key(api_key) or secrets.token_urlsafe(32)
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}
        if api_key:
            env[API_KEY_ENV] = api_key
        if command is None:
            command = sglang_command(
                model_path, host=host, port=port, api_key=api_key, dtype=dtype, python=python, extra_args=extra_args
            )
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="rollhub-server-", suffix=".log")
            os.close(handle)
            log_path = name
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        engine = cls(f"http://{host}:{port}", process=process, api_key=api_key or "")
        engine.log_path = log_path
        deadline = time.monotonic() + startup_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                tail = log_path.read_bytes()[-2000:].decode(errors="replace")
                raise SGLangError(
                    f"server exited with code {process.returncode} during startup (log {log_path}): {tail}"
                )
            if await engine.healthy():
                return engine
            await asyncio.sleep(0.25)
        await engine.close()
        raise SGLangError(f"server at {engine.url} not healthy after {startup_timeout_s:.0f} s")

    async def _http(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else None
            # no connection cap: aiohttp's default of 100 would queue requests on our side, out of
            # the server's batch; the number in flight is the rollout's concurrency to decide
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers=headers,
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._session

    async def _post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        session = await self._http()
        async with session.post(self.url + path, json=body or {}) as response:
            text = await response.text()
            if response.status != 200:
                raise SGLangError(f"POST {path} -> {response.status}: {text[:500]}", status=response.status)
            return _maybe_json(text)

    async def _get(self, path: str) -> Any:
        session = await self._http()
        async with session.get(self.url + path) as response:
            text = await response.text()
            if response.status != 200:
                raise SGLangError(f"GET {path} -> {response.status}: {text[:500]}", status=response.status)
            return _maybe_json(text)

    async def healthy(self) -> bool:
        import aiohttp

        try:
            session = await self._http()
            async with session.get(self.url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as response:
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    # --- InferenceEngine ---------------------------------------------------------------

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, request_id: str | None = None
    ) -> Generation:
        if self._closed:
            raise RuntimeError("engine is closed")
        rid = request_id or uuid.uuid4().hex
        version = self.weight_version  # used only when the server reports no version
        max_new = sampling.max_new_tokens
        if self.context_length is not None:  # SGLang refuses prompt + max_new_tokens >= its context length
            max_new = min(max_new, self.context_length - 1 - len(input_ids))
        if max_new <= 0:
            return Generation([], [], [], "length", request_id=rid, prompt_tokens=len(input_ids))
        params: dict[str, Any] = {
            "max_new_tokens": max_new,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
        }
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        body = {
            "input_ids": list(input_ids),
            "sampling_params": params,
            "return_logprob": True,
            "rid": rid,
            "stream": False,
        }
        if self.lora_name is not None:  # SGLang's field takes the adapter's name once it is loaded
            body["lora_path"] = self.lora_name
        self._in_flight.add(rid)
        try:
            reply = await self._post("/generate", body)
        except SGLangError as exc:
            limit = context_limit(str(exc))
            if limit is None:
                raise
            # no room left in the context: the in-process engine's "length", not a crashed episode
            self.context_length = limit
            if len(input_ids) < limit - 1 and max_new > limit - 1 - len(input_ids):
                return await self.generate(input_ids, sampling, request_id)
            return Generation([], [], [], "length", request_id=rid, prompt_tokens=len(input_ids))
        except asyncio.CancelledError:
            await asyncio.shield(self._abort_quietly(rid))
            raise
        finally:
            self._in_flight.discard(rid)
        return parse_generate_reply(reply, rid, version, len(input_ids))

    async def probe_logprob_mode(self, input_ids: list[int], *, pairs: int = 8) -> LogprobMode:
        """Ask the server, with a few one-token requests, how it reports log-probs (`logprob_mode`):
        a server started with SGLANG_RETURN_ORIGINAL_LOGPROB, or one that reports top-p / top-k
        log-probs before truncation, would otherwise skew every off-policy weight in silence."""
        temperatures = (1.0, PROBE_TEMPERATURE)

        async def one(temperature: float, top_k: int, seed: int) -> Generation:
            sampling = SamplingParams(max_new_tokens=1, temperature=temperature, top_k=top_k, seed=seed)
            return await self.generate(list(input_ids), sampling)

        top1 = await asyncio.gather(*(one(t, 1, 0) for t in temperatures))
        sampled = await asyncio.gather(*(one(t, 2, seed) for seed in range(pairs) for t in temperatures))
        return logprob_mode((top1[0], top1[1]), [(sampled[i], sampled[i + 1]) for i in range(0, len(sampled), 2)])

    async def update_weights(self, source: Any, version: int) -> None:
        """From an HF checkpoint dir (any server) or a state dict (written to a temp dir first)."""
        if isinstance(source, dict):
            with tempfile.TemporaryDirectory(prefix="rollhub-weights-") as folder:
                await asyncio.to_thread(_write_state_dict, source, Path(folder), await self._model_path())
                await self._update_from_disk(folder, version)
        else:
            await self._update_from_disk(str(source), version)

    async def _update_from_disk(self, path: str, version: int) -> None:
        await self.update_weights_from_disk(path, version)

    # --- weight-sync protocols (driven by rollhub.inference.weight_sync) ----------------------

    async def update_weights_from_disk(self, path: str, version: int) -> dict[str, Any]:
        """`/update_weights_from_disk`: the server loads the HF folder `path` (which it must be
        able to read) and takes `version`; raises SGLangError when it refuses or fails."""
        reply = await self._control("/update_weights_from_disk", {"model_path": path, "weight_version": str(version)})
        self.weight_version = int(version)
        return reply

    async def begin_weight_update(self) -> bool:
        """`/begin_weight_update` where the release has it: True when a session opened.

        SGLang 0.5.23 refuses distributed and tensor updates outside a weight-update session (its
        scheduler answers 400 without receiving, so rank 0's broadcast waits out its timeout);
        0.5.6 has no such route (404), and then nothing is opened. The route is learnt on the
        first call. A session a dead push left open is closed and opened afresh."""
        if self.weight_update_sessions is False:
            return False
        try:
            await self._control("/begin_weight_update", {"selector": "all"})
        except SGLangError as exc:
            if exc.status == 404:
                self.weight_update_sessions = False
                return False
            if "already open" not in str(exc):
                raise
            await self._control("/end_weight_update", {})
            await self._control("/begin_weight_update", {"selector": "all"})
        self.weight_update_sessions = True
        return True

    async def end_weight_update(self) -> None:
        """`/end_weight_update`: close the session `begin_weight_update` opened."""
        await self._control("/end_weight_update", {})

    async def init_weights_update_group(
        self,
        *,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        group_name: str,
        backend: str,
    ) -> dict[str, Any]:
        """`/init_weights_update_group`: the server joins the trainer's process group at rank
        `rank_offset` (the call returns once the group formed, so the trainer joins meanwhile)."""
        body = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "group_name": group_name,
            "backend": backend,
        }
        return await self._control("/init_weights_update_group", body)

    async def update_weights_from_distributed(
        self,
        *,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        version: int,
        group_name: str,
        flush_cache: bool = True,
        load_format: str | None = None,
    ) -> dict[str, Any]:
        """`/update_weights_from_distributed`: the server receives one broadcast per name, in
        order, from rank 0 (or one for the bucket, `load_format` "flattened_bucket"; the trainer
        broadcasts while this call waits) and takes `version`."""
        body: dict[str, Any] = {
            "names": list(names),
            "dtypes": list(dtypes),
            "shapes": [list(shape) for shape in shapes],
            "group_name": group_name,
            "weight_version": str(version),
            "flush_cache": bool(flush_cache),
        }
        if load_format is not None:
            body["load_format"] = load_format
        reply = await self._control("/update_weights_from_distributed", body)
        self.weight_version = int(version)
        return reply

    async def load_lora_adapter(self, name: str, path: str) -> dict[str, Any]:
        """`/load_lora_adapter`: the server loads the peft adapter folder `path` (which it must be able to
        read) under `name`; it needs --enable-lora, a --max-lora-rank and --lora-target-modules that cover
        the adapter. Raises SGLangError when it refuses (a 400 carries its `error_message`)."""
        reply = await self._lora("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        return reply

    async def unload_lora_adapter(self, name: str) -> dict[str, Any]:
        """`/unload_lora_adapter`: drop the adapter loaded under `name`."""
        return await self._lora("/unload_lora_adapter", {"lora_name": name})

    async def _lora(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A LoRA route, whose reply is `{"success", "error_message", "loaded_adapters"}` (400 on failure)."""
        reply = await self._post(path, body)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise SGLangError(f"{path} failed: {str(reply.get('error_message'))[:500]}")
        return reply if isinstance(reply, dict) else {"message": str(reply)[:500]}

    async def group_ranks(self) -> int:
        """Ranks this server brings to a weight update group: its tensor-parallel size, from
        `/get_server_info` (SGLang's server args; 1 for a server without the route). Data or
        pipeline parallel servers are refused: SGLang puts only tp ranks in the group."""
        if self.tp_size is None:
            try:
                info = await self._get("/get_server_info")
            except SGLangError:
                info = {}
            sizes = {key: _find_int(info, key) for key in ("tp_size", "dp_size", "pp_size")}
            for key in ("dp_size", "pp_size"):
                if (sizes[key] or 1) > 1:
                    raise SGLangError(f"server {self.url} runs {key}={sizes[key]}; weight pushes support tp only")
            self.tp_size = sizes["tp_size"] or 1
        return self.tp_size

    async def destroy_weights_update_group(self, group_name: str) -> dict[str, Any]:
        """`/destroy_weights_update_group` (SGLang >= 0.5): the server leaves the group."""
        return await self._control("/destroy_weights_update_group", {"group_name": group_name})

    async def _control(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """A control POST whose reply is `{"success", "message"}` (400 with the same on failure)."""
        reply = await self._post(path, body)
        if isinstance(reply, dict) and reply.get("success") is False:
            raise SGLangError(f"{path} failed: {str(reply.get('message'))[:500]}")
        return reply if isinstance(reply, dict) else {"message": str(reply)[:500]}

    async def _model_path(self) -> str | None:
        try:
            info = await self._get("/get_model_info")
        except SGLangError:
            return None
        return info.get("model_path") if isinstance(info, dict) else None

    async def pause(self) -> None:
        # "abort": in-flight requests return their partial output, so no reply spans two versions
        await self._post("/pause_generation", {"mode": "abort"})

    async def resume(self) -> None:
        await self._post("/continue_generation", {})

    async def abort(self, request_id: str) -> None:
        await self._post("/abort_request", {"rid": request_id})

    async def abort_all(self) -> None:
        await self._post("/abort_request", {"abort_all": True})

    async def flush_cache(self) -> bool:
        """True when flushed; False when the server is busy (SGLang answers 400)."""
        try:
            await self._get("/flush_cache")
        except SGLangError:
            return False
        return True

    async def update_weight_version(self, version: int) -> None:
        """`/update_weight_version`: label the weights a server holds (one that joins after a push)."""
        await self._post("/update_weight_version", {"new_version": str(version)})

    async def server_weight_version(self) -> str:
        return str((await self._get("/get_weight_version"))["weight_version"])

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            await self._session.close()
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                await asyncio.to_thread(self._process.wait, 30)
            except subprocess.TimeoutExpired:
                self._process.kill()

    async def _abort_quietly(self, rid: str) -> None:
        try:
            await self._post("/abort_request", {"rid": rid})
        except Exception as exc:  # best effort: the request may already be gone
            logger.debug("abort of %s failed: %r", rid, exc)


_CONTEXT_REFUSAL = re.compile(r"(?:longer than the model's context length|maximum context length of) \(?(\d+) tokens")


def context_limit(message: str) -> int | None:
    """The context length in SGLang's 400 for a prompt (or prompt + max_new_tokens) that does not fit."""
    if "-> 400" not in message:
        return None
    found = _CONTEXT_REFUSAL.search(message)
    return int(found.group(1)) if found else None


def _find_int(info: Any, key: str, depth: int = 0) -> int | None:
    """`key` in SGLang's server info, at the top or in a nested record (newer releases nest them)."""
    if not isinstance(info, dict) or depth > 3:
        return None
    if isinstance(info.get(key), int):
        return int(info[key])
    for value in info.values():
        found = _find_int(value, key, depth + 1)
        if found is not None:
            return found
    return None


def _maybe_json(text: str) -> Any:
    import json

    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def parse_generate_reply(reply: dict[str, Any], rid: str, version: int, prompt_tokens: int) -> Generation:
    """SGLang /generate reply -> Generation; ids come from the logprob triples, never from text."""
    meta = reply.get("meta_info", {})
    triples = meta.get("output_token_logprobs") or []
    token_ids = [int(t[1]) for t in triples] if triples else list(reply.get("output_ids") or [])
    logprobs = [float(t[0]) for t in triples]
    if len(logprobs) != len(token_ids):
        raise SGLangError("server returned no per-token logprobs; is return_logprob supported?")
    server_version = _int_version(meta.get("weight_version"))
    if server_version is not None:
        version = server_version
    versions = [version] * len(token_ids)
    per_token = meta.get("output_token_versions")  # rollhub serve: one per token
    if isinstance(per_token, list) and len(per_token) == len(token_ids):
        parsed = [_int_version(v) for v in per_token]
        if all(v is not None for v in parsed):
            versions = parsed  # type: ignore[assignment]
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else str(finish)
    reason = kind if kind in ("stop", "length", "abort") else "stop"
    return Generation(
        token_ids,
        logprobs,
        versions,
        reason,
        request_id=rid,
        prompt_tokens=prompt_tokens,
        meta={"e2e_latency_s": meta.get("e2e_latency", 0.0), "server_weight_version": meta.get("weight_version")},
    )


def _int_version(value: Any) -> int | None:
    """A version as the server reports it ("7"), or None for a label that is not ours ("default")."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def write_version_folder(state: dict[str, Any], weights_dir: Path, version: int, model_path: str | None) -> str:
    """`weights_dir/v{version:06d}`, written into a `.partial` sibling and renamed into place, so an
    engine never loads a half-written folder."""
    import shutil

    folder = weights_dir / f"v{version:06d}"
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    _write_state_dict(state, partial, model_path)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return str(folder)


def _write_state_dict(state: dict[str, Any], folder: Path, model_path: str | None) -> None:
    """A loadable HF dir: one safetensors file of `state` plus config files copied from the served
    model -- never its `*.index.json`: a sharded model's index names shard files this folder does
    not hold, and SGLang (like transformers) loads exactly the files an index names."""
    from safetensors.torch import save_file

    tensors = {name: tensor.detach().contiguous().cpu() for name, tensor in state.items()}
    seen: dict[int, str] = {}
    for name in list(tensors):  # safetensors refuses shared storage (tied embeddings)
        pointer = tensors[name].data_ptr()
        if pointer in seen:
            tensors[name] = tensors[name].clone()
        seen[pointer] = name
    save_file(tensors, str(folder / "model.safetensors"))
    if model_path and Path(model_path).is_dir():
        for item in Path(model_path).iterdir():
            if item.name.endswith(".index.json"):
                continue
            if item.suffix in (".json", ".jinja", ".txt", ".model") and not (folder / item.name).exists():
                shutil.copy(item, folder / item.name)
