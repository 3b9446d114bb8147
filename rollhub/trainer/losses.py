"""Policy-gradient losses with off-policy correction, over per-token tensors.

Three policies are kept apart (decoupled PPO):
  * mu      - behaviour: the log-probs the inference engine reported while sampling;
  * pi_prox - proximal: the trainer's recompute at the start of the step (= the weights
              last pushed to the engine);
  * pi_theta- current: the weights being optimised.
r = pi_theta / pi_prox is the PPO-style trust-region ratio; w = pi_prox / mu is the
staleness (and engine/trainer mismatch) correction. Keeping w separate is what makes async
training honest: if the ratio were taken against a recompute at the current weights only,
r would be 1 for every stale sample and nothing would be corrected (alibaba/ROLL#242).

A loss is chosen on two independent axes:
  * `objective`: one named function of `OBJECTIVES` (ppo: clip with optional dual clip;
    gspo, cispo, topr, reinforce), each giving the per-token loss before the weight w;
  * `correction` of w: "tis" (truncate at C, detached), "mis" (keep w inside the band [lo, hi],
    drop the token outside it, IcePop-style) or "none".
`ppo` + `tis` with C = 2 is decoupled PPO, the default. Every tensor is [batch, time]
with a 0/1 response mask; padding positions may hold anything finite.

Where a paper fixes more than the per-token form, the objective brings it as its default:
GSPO clips its sequence ratio at 3e-4 / 4e-4 and averages per sequence, TOPR sums each
trajectory and corrects with its own truncated trajectory ratio (no w on top). Unset
`aggregation` and `correction` take the objective's own; a setting that contradicts the
paper's form is refused (README, "Losses": which paper each option follows).

Aggregation takes an explicit normaliser (total tokens or sequences of the WHOLE batch),
so micro-batches with gradient accumulation sum to exactly the full-batch loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

AggregationMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"]
Objective = Literal["ppo", "cispo", "topr", "gspo", "reinforce"]
Correction = Literal["tis", "mis", "none"]
KLEstimator = Literal["k3", "k2", "full"]

#: each objective's aggregation as its paper writes it, taken when `aggregation` is unset: GRPO's
#: token-mean successors (DAPO, CISPO) for the token-level objectives, GSPO's per-sequence mean,
#: TOPR's per-trajectory sum
DEFAULT_AGGREGATION: dict[str, AggregationMode] = {
    "ppo": "token-mean",
    "cispo": "token-mean",
    "reinforce": "token-mean",
    "gspo": "seq-mean-token-mean",
    "topr": "seq-mean-token-sum",
}
#: the staleness correction taken when `correction` is unset; TOPR has its own (its trajectory ratio)
DEFAULT_CORRECTION: dict[str, Correction] = {
    "ppo": "tis",
    "cispo": "tis",
    "reinforce": "tis",
    "gspo": "tis",
    "topr": "none",
}
#: the clip below of the token ratio taken when `clip_low` is unset: PPO's 0.2; none for CISPO, whose
#: paper sets no lower bound on its IS weight (MiniMax-M1: "we did not impose a lower bound") and tunes
#: only the upper one. Objectives that do not clip the token ratio ignore it.
DEFAULT_CLIP_LOW: dict[str, float | None] = {"ppo": 0.2, "cispo": None}
Proximal = Literal["recompute", "behaviour"]


@dataclass
class LossConfig:
    objective: Objective = "ppo"  # the per-token loss, one of OBJECTIVES: ppo, gspo, cispo, topr, reinforce
    # weight pi_prox/mu: tis truncates at is_cap, mis keeps w inside the band and drops the token outside;
    # null = the objective's own (DEFAULT_CORRECTION: tis, none for topr, which corrects with its own ratio)
    correction: Correction | None = None
    # clip below of the token ratio (PPO, CISPO): ratio >= 1 - clip_low; null = the objective's own
    # (DEFAULT_CLIP_LOW: 0.2 for ppo, none for cispo, as its paper)
    clip_low: float | None = None
    clip_high: float = 0.28  # "clip-higher" (DAPO); set equal to clip_low for symmetric PPO
    dual_clip: float | None = 3.0  # lower bound c*A on the objective of negative-advantage tokens; None = off
    # GSPO's clip below of its sequence ratio (a geometric mean of token ratios: far tighter than PPO's)
    gspo_clip_low: float = 3e-4
    gspo_clip_high: float = 4e-4  # GSPO's clip above (the paper's 3e-4 / 4e-4)
    is_cap: float = 2.0  # C for "tis"
    mis_low: float = 0.5  # band for "mis"
    mis_high: float = 2.0  # upper end of the "mis" band
    # per-token losses to one number over the whole batch (see aggregate); null = the objective's own
    # (DEFAULT_AGGREGATION: token-mean, seq-mean-token-mean for gspo, seq-mean-token-sum for topr)
    aggregation: AggregationMode | None = None
    kl_coef: float = 0.0  # KL penalty to the reference policy (needs a reference policy)
    # k3: sampled-token estimate of KL(pi || ref), whose gradient as a loss is that of KL(ref || pi)
    #     (the GRPO paper's term); cheap, blind to mass moving onto tokens never sampled;
    # k2: sampled-token (log pi - log ref)^2 / 2, whose gradient is exactly that of KL(pi || ref);
    # full: exact KL(pi || ref) summed over the vocabulary at each response position, which also
    #     sees probability leaking onto malformed answers before they are ever sampled
    kl_estimator: KLEstimator = "k3"
    # > 0: entropy bonus (exploration); < 0: entropy penalty, which sharpens a policy that is
    # scored by sampling at T = 1 toward its own most likely answers (needs per-token entropy)
    entropy_coef: float = 0.0
    # pi_prox of PPO mini-batching: "recompute" = the trainer's weights at step start (one
    # no-grad pass over the batch; decoupled PPO); "behaviour" = the engine's mu, i.e.
    # plain PPO clipped against the sampling policy, no extra pass. Worth it only where
    # mu and the trainer barely differ (few versions of staleness, same numerics)
    proximal: Proximal = "recompute"

    @property
    def aggregation_mode(self) -> AggregationMode:
        """`aggregation`, or the objective's own when unset."""
        return self.aggregation or DEFAULT_AGGREGATION.get(self.objective, "token-mean")

    @property
    def clip_low_bound(self) -> float | None:
        """`clip_low`, or the objective's own when unset (None: no clip below)."""
        return self.clip_low if self.clip_low is not None else DEFAULT_CLIP_LOW.get(self.objective, 0.2)

    @property
    def correction_mode(self) -> Correction:
        """`correction`, or the objective's own when unset."""
        return self.correction or DEFAULT_CORRECTION.get(self.objective, "tis")

    @property
    def has_other_terms(self) -> bool:
        """The loss has a term besides the policy gradient (KL or entropy), which a sequence with
        advantage 0 still carries."""
        return self.kl_coef > 0 or self.entropy_coef != 0

    def validate(self) -> None:
        # written `not (in range)` so that nan fails too (the loader refuses it; direct construction does not)
        if not ((self.clip_low is None or 0 <= self.clip_low < 1) and self.clip_high >= 0):
            raise ValueError("clip_low must be in [0, 1) (or null: the objective's own) and clip_high >= 0")
        if not (0 <= self.gspo_clip_low < 1 and self.gspo_clip_high >= 0):
            raise ValueError("gspo_clip_low must be in [0, 1) and gspo_clip_high >= 0 (paper: 3e-4 and 4e-4)")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError("dual_clip must be > 1 (usually 3) or null")
        if not self.is_cap > 0:
            raise ValueError("is_cap must be > 0 (usually 2)")
        if not 0 <= self.mis_low < 1 < self.mis_high:
            raise ValueError("the mis band needs 0 <= mis_low < 1 < mis_high")
        if not self.kl_coef >= 0:
            raise ValueError("kl_coef must be >= 0")
        if not -1 <= self.entropy_coef <= 1:
            raise ValueError("entropy_coef must be in [-1, 1] (> 0: bonus, < 0: penalty; usually |c| <= 0.05)")
        if self.objective == "gspo" and self.aggregation not in (None, "seq-mean-token-mean"):
            raise ValueError(
                f"objective gspo averages each sequence's tokens, then the sequences (seq-mean-token-mean); "
                f"aggregation {self.aggregation} would weigh sequences by their length: leave loss.aggregation unset"
            )
        if self.objective == "topr" and self.correction not in (None, "none"):
            raise ValueError(
                f"objective topr corrects with its own truncated trajectory ratio pi/mu; correction "
                f"{self.correction} would weigh its tokens again (above TOPR's cap of 1): leave loss.correction unset"
            )


@dataclass
class BatchNormaliser:
    """Denominators of the aggregation, counted over the whole batch (all micro-batches)."""

    num_tokens: float
    num_sequences: float

    @classmethod
    def from_mask(cls, mask: torch.Tensor) -> BatchNormaliser:
        return cls(num_tokens=max(float(mask.sum()), 1.0), num_sequences=max(float((mask.sum(-1) > 0).sum()), 1.0))


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: AggregationMode, normaliser: BatchNormaliser | None = None
) -> torch.Tensor:
    """Reduce per-token values to a scalar.

    token-mean: sum m*l / sum m (long responses weigh more);
    seq-mean-token-mean: mean over sequences of each sequence's token mean;
    seq-mean-token-sum: mean over sequences of each sequence's token sum.
    """
    mask = mask.to(values.dtype)
    normaliser = normaliser or BatchNormaliser.from_mask(mask)
    masked = values * mask
    if mode == "token-mean":
        return masked.sum() / normaliser.num_tokens
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / normaliser.num_sequences
    if mode == "seq-mean-token-sum":
        return masked.sum() / normaliser.num_sequences
    raise ValueError(f"unknown aggregation mode {mode!r}")


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def ppo_clip_loss(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float | None, clip_high: float, dual_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token -min(r*A, clip(r)*A), with the dual-clip floor max(., c*A) for A < 0 (`clip_low` None:
    no clip below).

    Returns (loss, clipped) where `clipped` marks tokens whose gradient the clip removed.
    """
    unclipped = ratio * advantages
    clipped_objective = ratio.clamp(None if clip_low is None else 1.0 - clip_low, 1.0 + clip_high) * advantages
    objective = torch.minimum(unclipped, clipped_objective)
    clipped = clipped_objective < unclipped
    if dual_clip is not None:
        floor = dual_clip * advantages
        dual_hit = (advantages < 0) & (floor > objective)
        objective = torch.where(dual_hit, floor, objective)
        clipped = clipped | dual_hit
    clipped = clipped.to(ratio.dtype)
    return -objective, clipped


def behaviour_weight(
    prox_logp: torch.Tensor, behaviour_logp: torch.Tensor, correction: Correction, cap: float, band: tuple[float, float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The detached staleness weight applied to each token, and the raw w = pi_prox/mu.

    tis: min(w, cap); mis: w inside the band, 0 outside (IcePop: the band only decides which
    tokens are trusted, the kept ones are still importance-weighted); none: 1.
    """
    raw = torch.exp((prox_logp - behaviour_logp).detach().clamp(max=20.0))
    if correction == "tis":
        return raw.clamp(max=cap), raw
    if correction == "mis":
        keep = (raw >= band[0]) & (raw <= band[1])
        return torch.where(keep, raw, torch.zeros_like(raw)), raw
    if correction == "none":
        return torch.ones_like(raw), raw
    raise ValueError(f"unknown correction {correction!r}")


def gspo_token_ratio(logp: torch.Tensor, prox_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token ratio: value exp(mean_t log r_t) of the whole sequence, gradient of each token's own log pi."""
    m = mask.to(logp.dtype)
    seq_log_ratio = ((logp - prox_logp) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    return torch.exp(seq_log_ratio.detach() + logp - logp.detach())


# --- the objectives -----------------------------------------------------------------------
# Each takes (logp, prox_logp, behaviour_logp, ratio = pi_theta / pi_prox, advantages, mask, config)
# and returns the per-token loss before the staleness weight w, and a 0/1 mark of the tokens whose
# gradient the objective's clip removed (the clip-fraction metric).

ObjectiveFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossConfig],
    tuple[torch.Tensor, torch.Tensor],
]


def ppo_objective(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate on the token ratio, with the dual-clip floor when `config.dual_clip` is set."""
    return ppo_clip_loss(ratio, advantages, config.clip_low_bound, config.clip_high, config.dual_clip)


def gspo_objective(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO: the clip on one ratio per sequence (the geometric mean of its tokens'), at GSPO's own
    range (`gspo_clip_low/high`), no dual clip. The GSPO-token form: with one advantage per
    sequence its value and gradient are the paper's sequence-level ones."""
    seq_ratio = gspo_token_ratio(logp, prox_logp, mask)
    return ppo_clip_loss(seq_ratio, advantages, config.gspo_clip_low, config.gspo_clip_high, None)


def cispo_objective(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO: the clipped ratio as a detached weight, so a clipped token still gets a gradient. By
    default clipped above only (`clip_high`), as in the paper; `clip_low` adds a clip below."""
    low = config.clip_low_bound
    clipped_ratio = ratio.clamp(None if low is None else 1.0 - low, 1.0 + config.clip_high).detach()
    clipped = (clipped_ratio != ratio.detach()).to(ratio.dtype)
    return -clipped_ratio * advantages * logp, clipped


def topr_objective(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TOPR: positive samples get the plain policy gradient (SFT-like), negative ones the weight
    clamp(pi(tau) / mu(tau), 0, 1) of their whole trajectory (the packed sequence), against the
    sampling policy mu itself; the sign is the token's advantage (the paper's baselined reward)."""
    m = mask.to(logp.dtype)
    log_ratio = ((logp.detach() - behaviour_logp) * m).sum(-1, keepdim=True)
    negative_weight = torch.exp(log_ratio.clamp(max=0.0)).expand_as(logp)
    per_token = torch.where(advantages > 0, -advantages * logp, -negative_weight * advantages * logp)
    clipped = ((advantages <= 0) & (log_ratio > 0)).to(ratio.dtype)
    return per_token, clipped


def reinforce_objective(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE: -A log pi, no ratio and no clip (only the staleness weight corrects it)."""
    return -advantages * logp, torch.zeros_like(ratio)


#: `loss.objective` -> its function; the names are those of `Objective`
OBJECTIVES: dict[str, ObjectiveFn] = {
    "ppo": ppo_objective,
    "gspo": gspo_objective,
    "cispo": cispo_objective,
    "topr": topr_objective,
    "reinforce": reinforce_objective,
}


def k3_kl(logp: torch.Tensor, reference_logp: torch.Tensor) -> torch.Tensor:
    """k3 per token: exp(d) - d - 1 with d = log ref - log pi (>= 0, low variance).

    On tokens sampled from pi its value estimates KL(pi || ref) without bias, but as a loss its
    gradient (1 - ref/pi) grad log pi has the expectation of the gradient of the FORWARD
    KL(ref || pi), as in the GRPO paper; `k2_kl` is the estimator whose gradient is the reverse KL's.
    """
    d = (reference_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def k2_kl(logp: torch.Tensor, reference_logp: torch.Tensor) -> torch.Tensor:
    """k2 per token: (log pi - log ref)^2 / 2.

    Its value is a biased estimate of the KL, but as a loss on tokens sampled from pi its gradient
    (log pi - log ref) grad log pi has exactly the expectation of the gradient of the reverse
    KL(pi || ref), the penalty `full_kl` computes exactly.
    """
    d = (logp - reference_logp).clamp(-20.0, 20.0)
    return 0.5 * d * d


SAMPLED_KL: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {"k3": k3_kl, "k2": k2_kl}


def full_kl(logp_full: torch.Tensor, reference_full: torch.Tensor) -> torch.Tensor:
    """Exact KL(pi || ref) = sum_v pi(v) (log pi(v) - log ref(v)) per row of [n, vocab] log-probs."""
    return (logp_full.exp() * (logp_full - reference_full)).sum(-1)


def policy_loss(
    logp: torch.Tensor,
    prox_logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    *,
    normaliser: BatchNormaliser | None = None,
    reference_logp: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    kl_tokens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The training loss of one (micro-)batch and its off-policy health metrics.

    The KL term uses `kl_tokens` (per-token KL values with gradient, e.g. `full_kl`
    scattered onto the response positions) when given, else `config.kl_estimator` (k3 or k2)
    from `reference_logp`. TOPR takes no staleness weight: its own ratio is against mu.
    """
    mask_f = mask.to(logp.dtype)
    aggregation = config.aggregation_mode
    correction = config.correction_mode
    normaliser = normaliser or BatchNormaliser.from_mask(mask_f)
    objective = OBJECTIVES.get(config.objective)
    if objective is None:
        raise ValueError(f"unknown objective {config.objective!r} (one of {', '.join(OBJECTIVES)})")
    weight, w_raw = behaviour_weight(
        prox_logp, behaviour_logp, correction, config.is_cap, (config.mis_low, config.mis_high)
    )
    if config.objective == "topr":  # its own ratio is against mu: a weight on top would exceed its cap of 1
        weight = torch.ones_like(weight)
    ratio = torch.exp((logp - prox_logp).clamp(-20.0, 20.0))
    per_token, clipped = objective(logp, prox_logp, behaviour_logp, ratio, advantages, mask_f, config)
    per_token = weight * per_token
    loss = aggregate(per_token, mask_f, aggregation, normaliser)
    metrics: dict[str, float] = {}
    if config.kl_coef > 0:
        if kl_tokens is not None:
            kl = kl_tokens
        elif reference_logp is not None:
            estimator = SAMPLED_KL.get(config.kl_estimator)
            if estimator is None:
                raise ValueError(f"kl_estimator {config.kl_estimator!r} needs per-token KL values (kl_tokens)")
            kl = estimator(logp, reference_logp)
        else:
            raise ValueError("kl_coef > 0 needs reference log-probs (or per-token KL values)")
        loss = loss + config.kl_coef * aggregate(kl, mask_f, aggregation, normaliser)
        name = "full" if kl_tokens is not None else config.kl_estimator
        metrics[f"kl_reference_{name}"] = float(_masked_mean(kl.detach(), mask_f))
    if config.entropy_coef != 0:
        if entropy is None:
            raise ValueError("entropy_coef != 0 needs per-token entropy")
        loss = loss - config.entropy_coef * aggregate(entropy, mask_f, aggregation, normaliser)
    if entropy is not None:
        metrics["entropy"] = float(_masked_mean(entropy.detach(), mask_f))

    metrics.update(off_policy_metrics(w_raw, ratio.detach(), clipped, weight, mask_f, config))
    return loss, metrics


def off_policy_metrics(
    w_raw: torch.Tensor,
    ratio: torch.Tensor,
    clipped: torch.Tensor,
    weight: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
) -> dict[str, float]:
    """|w-1| mean and p95, fraction of w capped or masked, ratio clip fraction, k3 KL between mu and pi_prox.

    A KL jump without a version change points at an engine/trainer mismatch bug.
    """
    selected = mask > 0
    if not bool(selected.any()):
        return {}
    w = w_raw[selected]
    deviation = (w - 1.0).abs()
    # k3 with samples from mu estimates KL(mu || pi_prox): (pi/mu - 1) - log(pi/mu)
    kl = (w - 1.0) - torch.log(w.clamp(min=1e-12))
    metrics = {
        "offpolicy/w_abs_dev_mean": float(deviation.mean()),
        "offpolicy/w_abs_dev_p95": float(torch.quantile(deviation.float(), 0.95))
        if deviation.numel() > 1
        else float(deviation.max()),
        "offpolicy/kl_behaviour_prox_k3": float(kl.mean()),
        "offpolicy/ratio_clip_fraction": float(clipped[selected].mean()),
        "offpolicy/ratio_mean": float(ratio[selected].mean()),
    }
    correction = config.correction_mode
    if correction == "tis":
        metrics["offpolicy/w_capped_fraction"] = float((w > config.is_cap).to(w.dtype).mean())
    elif correction == "mis":
        metrics["offpolicy/w_masked_fraction"] = float((weight[selected] == 0).to(w.dtype).mean())
    return metrics
