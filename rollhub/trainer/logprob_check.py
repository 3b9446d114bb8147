"""Do the engine's behaviour log-probs mean what the loss assumes? Checked before RL starts.

The off-policy weight w = pi_prox / mu is only as right as mu. At version 0 the engine and the
trainer hold the same weights, so on the same tokens their log-probs must agree (up to numerics):
a model whose logits the trainer computed differently (a post-head transform), or a sampler that
reports log-probs of another distribution than it draws from (top-p / top-k before truncation, T = 1
log-probs at T != 1) shows as a gap there, long before it shows as a worse run. `engine_agreement`
samples a few short completions with the run's own sampling settings, scores them with the trainer
(softmax at T, renormalised over the same top-k / top-p set), and returns the gap as the run's first
metrics record (`check/*`), warning loudly above `WARN_NAT`.

SGLang servers are also asked how they report log-probs (`SGLangEngine.probe_logprob_mode`); a mode
that makes the off-policy weights wrong for this run's settings is refused (`refuse_*`).

Top-p / top-k with a loss that uses mu is refused for every engine (`refuse_truncated_sampling`): the
engine reports mu renormalised over the kept set, while the loss scores pi over the whole vocabulary,
so pi_prox / mu would be the kept mass Z of every position, not a staleness correction.
"""

from __future__ import annotations

import asyncio
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from rollhub.core.errors import UserError
from rollhub.inference.engines.base import SamplingParams
from rollhub.inference.engines.sampling import sampling_logprobs
from rollhub.rollout.types import Trajectory, Turn
from rollhub.trainer.policy import collate, response_positions

logger = logging.getLogger(__name__)

#: a version-0 gap above this many nats (max over the checked tokens) is warned about: bf16
#: engines and trainers stay within a few hundredths; a missed logit scale or a pre-truncation
#: log-prob is off by tenths
WARN_NAT = 0.1
PROMPTS = ("Hello.", "What is the next move?", "2 + 2 =", "Describe the room.")
CHECK_TOKENS = 8


@dataclass
class CheckConfig:
    """`check:` section: what the version-0 engine/trainer agreement check does with a gap."""

    # stop the run (an error before RL) when max |log mu - log pi| at version 0 exceeds this many nats;
    # null = only warn above WARN_NAT. A run whose off-policy weights would all be wrong should not start
    logprob_max_nat: float | None = None

    def validate(self) -> None:
        if self.logprob_max_nat is not None and not (self.logprob_max_nat > 0 and math.isfinite(self.logprob_max_nat)):
            raise ValueError(f"check.logprob_max_nat must be > 0 or null, got {self.logprob_max_nat}")


def truncates(agent: Any) -> bool:
    """The agent samples with top-p or top-k (and not greedily)."""
    return agent.temperature > 0 and (agent.top_p < 1.0 or agent.top_k > 0)


def uses_behaviour_logprobs(loss: Any) -> bool:
    """The loss weighs tokens by mu (a staleness correction, PPO against mu, or TOPR's own ratio)."""
    return loss.correction_mode != "none" or loss.proximal == "behaviour" or loss.objective == "topr"


def refuse_truncated_sampling(config: Any) -> None:
    """Refuse top-p / top-k sampling where the loss uses mu (`uses_behaviour_logprobs`).

    The rollhub engines report the probability a token was drawn with, p / Z over the kept set
    (SGLang reports p before truncation: wrong in another way, `check_server_modes`), while the
    trainer scores the untruncated pi. At version 0 every weight pi_prox / mu is then Z, not 1: TIS
    or MIS would weigh (or drop) tokens by how much mass the nucleus cut, and PPO against mu would
    clip on it. Scoring pi under the same truncation would need the kept set of pi at every
    position, where a token sampled by an older policy may lie outside it; so the combination is
    refused, and a loss that never reads mu (correction none, proximal recompute, not TOPR) compares
    the trainer with itself and may sample truncated."""
    if truncates(config.agent) and uses_behaviour_logprobs(config.loss):
        raise UserError(
            f"agent.top_p={config.agent.top_p} / agent.top_k={config.agent.top_k} with a loss that reads the "
            "engine's log-probs (loss.correction, loss.proximal: behaviour, objective topr): the engine reports "
            "each token's probability within the top-p/top-k set, the trainer scores the whole distribution, so "
            "every off-policy weight would be the kept mass, not a correction; sample without truncation "
            "(agent.top_p: 1, agent.top_k: -1) or set loss.correction: none with loss.proximal: recompute"
        )


def _truncation_message(config: Any) -> str:
    return (
        f"agent.top_p={config.agent.top_p} / agent.top_k={config.agent.top_k} on SGLang: its log-probs are "
        "those before truncation, not the probability each token was sampled with, so the loss's off-policy "
        "weights (loss.correction, loss.proximal: behaviour, objective topr) would be wrong; sample without "
        "top-p/top-k (agent.top_p: 1, agent.top_k: -1), use the rollhub engine, or set loss.correction: none "
        "with loss.proximal: recompute"
    )


def _sglang_clients(engine: Any) -> list[Any]:
    from rollhub.inference.engines.sglang import SGLangEngine

    if isinstance(engine, SGLangEngine):
        return [engine]
    replicas = getattr(engine, "replicas", None)  # the router's list of replicas (a property)
    if callable(replicas):
        replicas = replicas()
    return [r.client for r in replicas or () if getattr(r, "live", False) and r.client is not None]


async def check_server_modes(engine: Any, config: Any, prompt: list[int]) -> dict[str, float]:
    """Probe each SGLang-speaking server of `engine`; refuse a mode that breaks this run's weights."""
    metrics: dict[str, float] = {}
    for client in _sglang_clients(engine):
        mode = await client.probe_logprob_mode(prompt)
        if mode.temperature_scaled is not None:
            metrics["check/engine_temperature_scaled"] = float(mode.temperature_scaled)
        if mode.renormalised is not None:
            metrics["check/engine_truncation_renormalised"] = float(mode.renormalised)
        temperature = config.agent.temperature
        if mode.temperature_scaled is False and temperature not in (0.0, 1.0):
            raise UserError(
                f"the server at {client.url} reports log-probs at T = 1 (SGLANG_RETURN_ORIGINAL_LOGPROB is set?) "
                f"while the run samples at agent.temperature={temperature}: every pi / mu would be off; restart it "
                "without SGLANG_RETURN_ORIGINAL_LOGPROB"
            )
        if mode.renormalised is False and truncates(config.agent) and uses_behaviour_logprobs(config.loss):
            raise UserError(f"server at {client.url}: " + _truncation_message(config))
    return metrics


def _prompts(tokenizer: Any) -> list[list[int]]:
    out = []
    for text in PROMPTS:
        ids = None
        if getattr(tokenizer, "chat_template", None):
            try:
                ids = tokenizer.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
                )
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            except Exception:  # a template that wants more than one user message
                ids = None
        out.append(ids or list(tokenizer.encode(text)) or [0])
    return out


async def engine_agreement(engine: Any, policy: Any, config: Any, *, seed: int = 0) -> dict[str, float]:
    """The version-0 check (module docstring): max and mean |log mu - log pi| over a few sampled tokens."""
    agent = config.agent
    prompts = _prompts(policy.tokenizer)
    metrics = await check_server_modes(engine, config, prompts[0])
    sampling = [
        SamplingParams(
            max_new_tokens=max(1, min(agent.max_new_tokens, CHECK_TOKENS)),
            temperature=agent.temperature,
            top_p=agent.top_p,
            top_k=agent.top_k,
            seed=seed + i,
        )
        for i in range(len(prompts))
    ]
    generations = await asyncio.gather(
        *(
            engine.generate(list(p), s, request_id=f"logprob-check-{i}-0")
            for i, (p, s) in enumerate(zip(prompts, sampling))
        )
    )
    turns = [
        Turn(
            prompt_ids=list(p),
            response_ids=list(g.token_ids),
            behaviour_logprobs=list(g.logprobs),
            token_versions=list(g.token_versions),
        )
        for p, g in zip(prompts, generations)
        if g.token_ids
    ]
    if not turns:
        return metrics
    sequences = [
        s for i, turn in enumerate(turns) for s in Trajectory(env_id="check", seed=i, turns=[turn]).packed_sequences()
    ]
    batch = collate(sequences, [[0.0] * len(s.input_ids) for s in sequences], policy.tokenizer.pad_token_id)
    gap = await asyncio.to_thread(_trainer_gap, policy, batch, agent)
    metrics.update(
        {
            "check/logprob_v0_max_abs_diff": float(gap.max()),
            "check/logprob_v0_mean_abs_diff": float(gap.mean()),
            "check/logprob_v0_tokens": float(gap.numel()),
        }
    )
    limit = getattr(getattr(config, "check", None), "logprob_max_nat", None)
    if limit is not None and float(gap.max()) > limit:
        raise UserError(
            f"engine and trainer log-probs disagree at version 0: max |log mu - log pi| = {float(gap.max()):.3f} nat "
            f"over {gap.numel()} tokens, above check.logprob_max_nat={limit}: every off-policy weight would carry "
            "that error; check the model's logit path, the engine's log-prob mode and the sampling settings"
        )
    if float(gap.max()) > WARN_NAT:
        logger.warning(
            "!!! engine and trainer log-probs disagree at version 0: max |log mu - log pi| = %.3f nat over %d tokens "
            "(mean %.4f), above %.2f. Every off-policy weight pi/mu of this run carries that error: check the model "
            "(a logit transform the engine or trainer misses), the engine's log-prob mode and the sampling settings "
            "(temperature %s, top_p %s, top_k %s)",
            float(gap.max()),
            gap.numel(),
            float(gap.mean()),
            WARN_NAT,
            agent.temperature,
            agent.top_p,
            agent.top_k,
        )
    return metrics


@torch.no_grad()
def _trainer_gap(policy: Any, batch: Any, agent: Any) -> torch.Tensor:
    """|engine log-prob - trainer log-prob| of every response token, the trainer scoring with the
    distribution the sampler draws from (softmax at T, renormalised over the top-k / top-p set)."""
    greedy = agent.temperature <= 0
    with policy.at_temperature(1.0 if greedy else agent.temperature):
        _, _, full = policy.token_logprobs(batch, with_full=True)
    if not greedy:
        full = sampling_logprobs(full.float(), agent.top_p, agent.top_k)
    batch = batch.to(full.device)
    rows, cols = response_positions(batch)
    tokens = batch.input_ids[:, 1:][rows, cols]
    trainer = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    engine = batch.behaviour_logprobs[rows, cols + 1].to(trainer.dtype)
    return (engine - trainer).abs().cpu()


async def version0_check(run: Any) -> dict[str, float]:
    """`engine_agreement` for a training job's `Run`, for its first metrics record (step 0). Trainer ranks
    skip the trainer side (a sharded forward needs every rank), not the server probe."""
    if run.ranks is not None or getattr(run.policy, "fsdp", False):
        prompt = _prompts(run.policy.tokenizer)[0]
        return await check_server_modes(run.engine, run.config, prompt)
    return await engine_agreement(run.engine, run.policy, run.config, seed=run.config.seed)
