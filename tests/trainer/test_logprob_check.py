"""The version-0 check: engine and trainer log-probs agree on a few tokens sampled with the run's own
settings, the gap is the run's first metrics record, and a gap (a missed logit transform, a sampler
reporting another distribution than it draws from) is warned about; SGLang log-prob modes that
would skew the off-policy weights are refused."""

import json
import logging
from types import SimpleNamespace

import pytest
import torch

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import Generation
from rollhub.inference.engines.sglang import LogprobMode, logprob_mode, parse_generate_reply
from rollhub.trainer.logprob_check import WARN_NAT, check_server_modes, engine_agreement
from rollhub.trainer.losses import LossConfig
from rollhub.trainer.policy import Policy

torch.set_num_threads(1)


def _config(temperature=1.0, top_p=1.0, top_k=-1, **loss):
    agent = SimpleNamespace(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=6)
    return SimpleNamespace(agent=agent, loss=LossConfig(**loss))


@pytest.mark.parametrize(
    ("temperature", "top_p", "top_k"), [(1.0, 1.0, -1), (0.7, 0.6, -1), (1.0, 1.0, 3), (0.0, 1.0, -1)]
)
async def test_engine_and_trainer_agree_at_version_0(tiny_model_dir, temperature, top_p, top_k):
    from rollhub.inference.engines.hf import HFEngine

    engine = HFEngine(tiny_model_dir, threads=1, max_batch_size=4)
    try:
        policy = Policy(tiny_model_dir, device="cpu", temperature=max(temperature, 0.5))
        metrics = await engine_agreement(engine, policy, _config(temperature, top_p, top_k))
    finally:
        await engine.close()
    assert metrics["check/logprob_v0_tokens"] >= 8
    assert metrics["check/logprob_v0_max_abs_diff"] < 1e-4


async def test_a_missed_logit_transform_shows_and_is_warned_about(tmp_path, caplog):
    """What the check would have said about a Granite checkpoint before the trainer applied its scaling."""
    from test_logit_transforms import _tiny

    from rollhub.inference.engines.hf import HFEngine

    model_dir = _tiny(tmp_path / "granite", "granite", logits_scaling=8.0)
    engine = HFEngine(model_dir, threads=1, max_batch_size=4)
    try:
        policy = Policy(model_dir, device="cpu")
        assert (await engine_agreement(engine, policy, _config()))["check/logprob_v0_max_abs_diff"] < 1e-4
        policy._logit_transform = None  # the trainer as it was: head(hidden) / T
        with caplog.at_level(logging.WARNING):
            metrics = await engine_agreement(engine, policy, _config())
    finally:
        await engine.close()
    assert metrics["check/logprob_v0_max_abs_diff"] > WARN_NAT
    assert "disagree at version 0" in caplog.text


def test_the_check_is_the_first_record_of_a_run(tmp_path, tiny_model_dir):
    import asyncio

    from trainer_testing import tiny_recipe

    from rollhub.core.config import load_config
    from rollhub.trainer.config import RunConfig
    from rollhub.trainer.job import run_training

    recipe = tiny_recipe(
        tmp_path, tiny_model_dir, train={"steps": 0}, agent={"top_p": 0.8}, loss={"correction": "none"}
    )
    config = load_config(RunConfig, recipe)
    asyncio.run(run_training(config, progress=False, print_fn=lambda *_: None))
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert first["check/logprob_v0_max_abs_diff"] < 1e-3
    assert first["check/logprob_v0_tokens"] > 0


# --- SGLang's log-prob modes ----------------------------------------------------------------------


def _reply(token, logprob):
    """A /generate reply as SGLang writes it (output_token_logprobs triples)."""
    meta = {"output_token_logprobs": [[logprob, token, None]], "finish_reason": {"type": "length"}}
    return parse_generate_reply({"meta_info": meta}, "r", 0, 3)


def test_mode_of_sglang_with_and_without_original_logprobs():
    # tempered, pre-truncation (SGLang's default): the argmax at T=1 and T=0.5 reported at -0.9 and -0.4
    assert logprob_mode((_reply(5, -0.9), _reply(5, -0.4)), []) == LogprobMode(True, False)
    # SGLANG_RETURN_ORIGINAL_LOGPROB: the same T = 1 value whatever T sampled
    assert logprob_mode((_reply(5, -0.9), _reply(5, -0.9)), []) == LogprobMode(False, False)
    # renormalised over the kept set (rollhub serve): top_k 1 gives log 1; a sampled pair decides T
    sampled = [(_reply(7, -2.0), _reply(9, -1.0)), (_reply(4, -1.3), _reply(4, -0.6))]
    assert logprob_mode((_reply(5, 0.0), _reply(5, 0.0)), sampled) == LogprobMode(True, True)
    assert logprob_mode((_reply(5, 0.0), _reply(5, 0.0)), sampled[:1]) == LogprobMode(None, True)


class _Server:
    """An SGLang client whose probe answers with a fixed mode (the probe itself is tested above and
    against rollhub serve below)."""

    url = "http://sglang"

    def __init__(self, mode):
        self.mode = mode

    async def probe_logprob_mode(self, prompt):
        return self.mode


async def test_modes_that_skew_the_weights_are_refused(monkeypatch):
    from rollhub.trainer import logprob_check

    monkeypatch.setattr(logprob_check, "_sglang_clients", lambda engine: [engine])
    original = _Server(LogprobMode(False, False))
    with pytest.raises(UserError, match="SGLANG_RETURN_ORIGINAL_LOGPROB"):
        await check_server_modes(original, _config(temperature=0.7), [1, 2])
    assert (await check_server_modes(original, _config(temperature=1.0), [1, 2]))[
        "check/engine_temperature_scaled"
    ] == 0
    sglang = _Server(LogprobMode(True, False))
    with pytest.raises(UserError, match="before truncation"):
        await check_server_modes(sglang, _config(top_p=0.9), [1, 2])
    await check_server_modes(sglang, _config(top_p=0.9, correction="none"), [1, 2])  # mu unused: allowed
    await check_server_modes(sglang, _config(), [1, 2])


async def test_rollhub_serve_reports_tempered_renormalised_logprobs(engine_apps):
    from rollhub.inference.engines.sglang import SGLangEngine

    _, _, urls = engine_apps
    client = SGLangEngine(urls[0])
    try:
        mode = await client.probe_logprob_mode([3, 14, 15, 92, 65])
    finally:
        await client.close()
    assert mode == LogprobMode(True, True)


def test_generation_type_is_what_the_probe_reads():
    g = _reply(5, -0.25)
    assert isinstance(g, Generation) and g.token_ids == [5] and g.logprobs == [-0.25]


def test_top_p_or_top_k_with_a_loss_that_reads_mu_is_refused_on_every_engine():
    """The engine's mu is renormalised over the kept set, the trainer's pi is not: at version 0 every
    pi / mu is the kept mass Z (< 1), so a loss that reads mu is refused with truncated sampling."""
    from rollhub.core.config import load_config
    from rollhub.inference.engines.sampling import sampling_logprobs
    from rollhub.trainer.config import RunConfig

    full = torch.log_softmax(torch.tensor([2.0, 1.0, 0.5, -1.0, -3.0]), -1)
    truncated = sampling_logprobs(full, 0.8, -1)
    kept = torch.isfinite(truncated)
    log_weights = full[kept] - truncated[kept]  # log pi - log mu on every token the sampler can draw
    assert torch.allclose(log_weights, torch.logsumexp(full[kept], -1).expand_as(log_weights))
    assert float(log_weights[0]) < -0.05

    servers = (["engine.backend=server", "engine.launch=rollhub"], ["engine.backend=server", "engine.launch=sglang"])
    for engine in ([], *servers):
        for sampling in (["agent.top_p=0.9"], ["agent.top_k=20"]):
            for loss in ([], ["loss.proximal=behaviour", "loss.correction=none"], ["loss.objective=topr"]):
                with pytest.raises(UserError, match="agent.top_p: 1, agent.top_k: -1"):
                    load_config(RunConfig, None, [*engine, *sampling, *loss])
            load_config(RunConfig, None, [*engine, *sampling, "loss.correction=none"])  # mu unused by the loss
    load_config(RunConfig, None, ["agent.top_p=0.9", "agent.temperature=0"])  # greedy: no truncation


async def test_the_check_reaches_every_server_behind_the_router(engine_apps):
    """The router's `replicas` is a list (a property): the probe must reach each live server."""
    from rollhub.inference.engines.router import EngineRouter, replicas_from_urls
    from rollhub.trainer.logprob_check import _sglang_clients

    _, _, urls = engine_apps
    router = EngineRouter(replicas_from_urls(urls))
    try:
        clients = _sglang_clients(router)
        assert sorted(c.url for c in clients) == sorted(urls)
        metrics = await check_server_modes(router, _config(temperature=0.7), [3, 14, 15])
        assert metrics["check/engine_temperature_scaled"] == 1.0
    finally:
        await router.close()


async def test_a_gap_above_check_logprob_max_nat_stops_the_run(tmp_path):
    """`check.logprob_max_nat` turns the warning into an error before RL starts."""
    from test_logit_transforms import _tiny

    from rollhub.inference.engines.hf import HFEngine
    from rollhub.trainer.logprob_check import CheckConfig

    model_dir = _tiny(tmp_path / "granite", "granite", logits_scaling=8.0)
    engine = HFEngine(model_dir, threads=1, max_batch_size=4)
    config = _config()
    try:
        policy = Policy(model_dir, device="cpu")
        policy._logit_transform = None  # a trainer that misses the model's logit scaling
        config.check = CheckConfig(logprob_max_nat=0.5)
        with pytest.raises(UserError, match="above check.logprob_max_nat=0.5"):
            await engine_agreement(engine, policy, config)
        config.check = CheckConfig(logprob_max_nat=1e6)  # a loose limit: the metrics come back
        assert (await engine_agreement(engine, policy, config))["check/logprob_v0_max_abs_diff"] > WARN_NAT
    finally:
        await engine.close()
    with pytest.raises(ValueError, match="logprob_max_nat must be > 0"):
        CheckConfig(logprob_max_nat=0).validate()
