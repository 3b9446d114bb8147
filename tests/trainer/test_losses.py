"""Losses against hand-computed values, and the stale-sample regression (alibaba/ROLL#242)."""

import math

import pytest
import torch

from rollhub.trainer.losses import BatchNormaliser, LossConfig, aggregate, k3_kl, policy_loss, ppo_clip_loss

torch.set_num_threads(1)


def t(*rows):
    return torch.tensor(rows, dtype=torch.float64)


def test_ppo_clip_hand_values():
    ratio = t([1.5, 0.5, 0.5, 5.0])
    adv = t([1.0, 1.0, -1.0, -1.0])
    loss, clipped = ppo_clip_loss(ratio, adv, 0.2, 0.2, dual_clip=None)
    assert loss.flatten().tolist() == pytest.approx([-1.2, -0.5, 0.8, 5.0])
    assert clipped.flatten().tolist() == [1.0, 0.0, 1.0, 0.0]
    loss, clipped = ppo_clip_loss(ratio, adv, 0.2, 0.2, dual_clip=3.0)
    assert loss.flatten().tolist() == pytest.approx([-1.2, -0.5, 0.8, 3.0])  # dual clip caps the negative side at c*|A|
    assert clipped[0, 3] == 1.0


def test_aggregation_modes():
    values = t([1.0, 2.0, 3.0], [4.0, 0.0, 0.0])
    mask = t([1, 1, 1], [1, 0, 0])
    assert float(aggregate(values, mask, "token-mean")) == pytest.approx(10 / 4)
    assert float(aggregate(values, mask, "seq-mean-token-mean")) == pytest.approx((2 + 4) / 2)
    assert float(aggregate(values, mask, "seq-mean-token-sum")) == pytest.approx((6 + 4) / 2)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_micro_batches_sum_to_full_batch(mode):
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(4, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(4, 5, generator=gen) > 0.3).double()
    mask[:, 0] = 1
    full = aggregate(values, mask, mode)
    norm = BatchNormaliser.from_mask(mask)
    parts = aggregate(values[:2], mask[:2], mode, norm) + aggregate(values[2:], mask[2:], mode, norm)
    assert float(parts) == pytest.approx(float(full))


def _stale_batch():
    # three tokens; the engine sampled them from an older policy mu
    prox = torch.log(t([0.5, 0.2, 0.6]))
    behaviour = torch.log(t([0.25, 0.4, 0.1]))  # w = 2.0, 0.5, 6.0
    adv = t([1.0, 1.0, 1.0])
    mask = t([1.0, 1.0, 1.0])
    return prox, behaviour, adv, mask


def test_stale_sample_is_corrected_with_bounded_weight():
    prox, behaviour, adv, mask = _stale_batch()
    logp = prox.clone().requires_grad_(True)  # first optimiser step: pi_theta == pi_prox
    loss, metrics = policy_loss(logp, prox, behaviour, adv, mask, LossConfig(aggregation="seq-mean-token-sum"))
    loss.backward()
    # d loss / d logp = -min(w, 2) * A * r with r = 1: the stale tokens get w != 1, capped at C = 2
    assert logp.grad.flatten().tolist() == pytest.approx([-2.0, -0.5, -2.0])
    assert metrics["offpolicy/w_abs_dev_mean"] == pytest.approx((1.0 + 0.5 + 5.0) / 3)
    assert metrics["offpolicy/w_capped_fraction"] == pytest.approx(1 / 3)
    assert metrics["offpolicy/kl_behaviour_prox_k3"] > 0


def test_fresh_sample_has_unit_weight():
    prox = torch.log(t([0.5, 0.2]))
    logp = prox.clone().requires_grad_(True)
    loss, metrics = policy_loss(logp, prox, prox.clone(), t([1.0, -1.0]), t([1.0, 1.0]), LossConfig())
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-0.5, 0.5])
    assert metrics["offpolicy/w_abs_dev_mean"] == pytest.approx(0.0)
    assert metrics["offpolicy/kl_behaviour_prox_k3"] == pytest.approx(0.0)


def test_masked_importance_sampling_drops_out_of_band_tokens():
    prox, behaviour, adv, mask = _stale_batch()
    logp = prox.clone().requires_grad_(True)
    cfg = LossConfig(correction="mis", mis_low=0.4, mis_high=3.0, aggregation="seq-mean-token-sum")
    loss, metrics = policy_loss(logp, prox, behaviour, adv, mask, cfg)
    loss.backward()
    # w = 2 and 0.5 are inside [0.4, 3] and weigh the token; w = 6 is outside: dropped
    assert logp.grad.flatten().tolist() == pytest.approx([-2.0, -0.5, 0.0])
    assert metrics["offpolicy/w_masked_fraction"] == pytest.approx(1 / 3)


def test_uncorrected_ppo_ignores_staleness():
    prox, behaviour, adv, mask = _stale_batch()
    logp = prox.clone().requires_grad_(True)
    loss, _ = policy_loss(
        logp, prox, behaviour, adv, mask, LossConfig(correction="none", aggregation="seq-mean-token-sum")
    )
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1.0, -1.0, -1.0])


def test_cispo_keeps_gradient_of_clipped_tokens():
    prox = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(1.5), 0.0]], dtype=torch.float64, requires_grad=True)  # r = 1.5 (clipped), 1.0
    cfg = LossConfig(
        objective="cispo", correction="none", clip_low=0.2, clip_high=0.2, aggregation="seq-mean-token-sum"
    )
    loss, metrics = policy_loss(logp, prox, prox, t([1.0, 1.0]), t([1.0, 1.0]), cfg)
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-1.2, -1.0])  # PPO would give 0 for the first token
    assert metrics["offpolicy/ratio_clip_fraction"] == pytest.approx(0.5)


def test_cispo_clips_only_above_by_default_as_its_paper():
    """r = 0.5 keeps its weight 0.5 (no clip below unless clip_low is set); r = 1.5 is clipped to 1.28."""
    prox = torch.zeros(1, 2, dtype=torch.float64)
    ratios = [0.5, 1.5]
    for cfg, weights, fraction in (
        (LossConfig(objective="cispo", correction="none", aggregation="seq-mean-token-sum"), [0.5, 1.28], 0.5),
        (
            LossConfig(objective="cispo", correction="none", aggregation="seq-mean-token-sum", clip_low=0.2),
            [0.8, 1.28],
            1,
        ),
    ):
        logp = torch.log(torch.tensor([ratios], dtype=torch.float64)).requires_grad_(True)
        loss, metrics = policy_loss(logp, prox, prox, t([1.0, 1.0]), t([1.0, 1.0]), cfg)
        loss.backward()
        assert logp.grad.flatten().tolist() == pytest.approx([-w for w in weights])
        assert metrics["offpolicy/ratio_clip_fraction"] == pytest.approx(fraction)
    assert LossConfig().clip_low_bound == 0.2 and LossConfig(objective="cispo").clip_low_bound is None
    with pytest.raises(ValueError, match="clip_low"):
        LossConfig(clip_low=1.5).validate()


def test_topr_truncates_negative_samples_only():
    prox = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[math.log(2.0), math.log(2.0)]], dtype=torch.float64, requires_grad=True)
    cfg = LossConfig(objective="topr", correction="none", aggregation="seq-mean-token-sum")
    loss, _ = policy_loss(logp, prox, prox, t([1.0, -1.0]), t([1.0, 1.0]), cfg)
    loss.backward()
    # positive: -A; negative: -clamp(r, 0, 1) * A = +1
    assert logp.grad.flatten().tolist() == pytest.approx([-1.0, 1.0])


def test_gspo_uses_the_sequence_ratio():
    prox = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.tensor([[0.1, 0.3]], dtype=torch.float64, requires_grad=True)  # geometric mean ratio exp(0.2)
    cfg = LossConfig(
        objective="gspo", correction="none", gspo_clip_low=0.5, gspo_clip_high=0.5, aggregation="seq-mean-token-sum"
    )
    loss, metrics = policy_loss(logp, prox, prox, t([1.0, 1.0]), t([1.0, 1.0]), cfg)
    assert float(loss.detach()) == pytest.approx(-2 * math.exp(0.2))
    loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([-math.exp(0.2), -math.exp(0.2)])


def test_kl_and_entropy_terms():
    logp = torch.log(t([0.5]))
    ref = torch.log(t([0.25]))
    assert float(k3_kl(logp, ref)) == pytest.approx(0.5 - math.log(0.5) - 1)
    cfg = LossConfig(correction="none", kl_coef=0.1, entropy_coef=0.01, aggregation="token-mean")
    base, _ = policy_loss(logp, logp, logp, t([0.0]), t([1.0]), LossConfig(correction="none"))
    loss, metrics = policy_loss(logp, logp, logp, t([0.0]), t([1.0]), cfg, reference_logp=ref, entropy=t([2.0]))
    assert float(loss - base) == pytest.approx(0.1 * (0.5 - math.log(0.5) - 1) - 0.01 * 2.0)
    assert metrics["entropy"] == pytest.approx(2.0)
    with pytest.raises(ValueError):
        policy_loss(logp, logp, logp, t([0.0]), t([1.0]), cfg)


def test_a_negative_entropy_coef_is_a_penalty_that_sharpens():
    """entropy_coef < 0 adds |c| x entropy to the loss: a gradient step lowers the entropy."""
    logits = torch.tensor([[1.0, 0.5, 0.0, -0.5]], requires_grad=True)
    logp_all = torch.log_softmax(logits, -1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    logp = logp_all[:, :1]
    cfg = LossConfig(correction="none", entropy_coef=-0.05, aggregation="token-mean")
    base, _ = policy_loss(logp, logp, logp, t([0.0]), t([1.0]), LossConfig(correction="none"))
    loss, metrics = policy_loss(logp, logp.detach(), logp.detach(), t([0.0]), t([1.0]), cfg, entropy=entropy)
    assert float(loss - base) == pytest.approx(0.05 * float(entropy))
    loss.backward()
    with torch.no_grad():
        stepped = torch.log_softmax(logits - 1.0 * logits.grad, -1)
        assert float(-(stepped.exp() * stepped).sum()) < float(entropy)
    with pytest.raises(ValueError, match="entropy_coef"):
        LossConfig(entropy_coef=-2.0).validate()


def test_config_validation():
    with pytest.raises(ValueError):
        LossConfig(mis_low=1.5).validate()
    with pytest.raises(ValueError):
        LossConfig(dual_clip=0.5).validate()


def test_full_kl_sees_mass_moved_onto_a_token_never_sampled():
    """k3 on the sampled token cannot tell; the exact KL over the vocabulary can."""
    from rollhub.trainer.losses import full_kl

    reference = torch.log(torch.tensor([[0.90, 0.09, 0.01]]))
    policy = torch.log(torch.tensor([[0.90, 0.01, 0.09]]))  # mass moved from token 1 onto token 2
    sampled = torch.tensor([0])  # the sampled token keeps its probability
    assert float(k3_kl(policy[:, sampled], reference[:, sampled])) == pytest.approx(0.0, abs=1e-6)
    expected = 0.01 * math.log(0.01 / 0.09) + 0.09 * math.log(0.09 / 0.01)
    assert float(full_kl(policy, reference)) == pytest.approx(expected, rel=1e-5)
    assert float(full_kl(reference, reference)) == pytest.approx(0.0, abs=1e-7)
    logits = torch.zeros(1, 3, requires_grad=True)
    full_kl(torch.log_softmax(logits, -1), reference).backward()
    assert logits.grad.abs().sum() > 0  # the penalty trains every token's logit


# --- every objective against frozen values ---------------------------------------------------
# Values of the loss before the objectives became named functions (hand-checked on the ppo row:
# token (0, 1) is inside the clip, so d/dlogp = -min(w, 2) * r * A / 7 = -exp(-0.2) * exp(-0.3) * 1.5 / 7).
# The tensors put tokens on every branch: clipped above and below, a dual-clip hit (r = e^1.3, A < 0), a
# negative-advantage token with r < 1 (TOPR's truncation), w above the TIS cap and outside the MIS band.


def _frozen_tensors():
    prox = torch.log(t([0.5, 0.2, 0.6, 0.3], [0.4, 0.1, 0.7, 0.25]))
    logp = (prox + t([0.5, -0.3, 0.1, 0.0], [1.3, -0.4, 0.2, 0.05])).requires_grad_(True)
    behaviour = prox + t([-0.9, 0.2, 0.8, 0.0], [0.3, -0.1, -0.6, 1.0])
    adv = t([1.5, 1.5, -0.5, 0.0], [-2.0, -2.0, -2.0, 0.7])
    mask = t([1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    return logp, prox, behaviour, adv, mask


FROZEN = [  # objective, correction, aggregation, loss, d loss / d logp (row-major), clip fraction
    (
        "ppo",
        "tis",
        "token-mean",
        0.8417203708435546,
        [0.0, -0.129970855653, 0.035470378842, -0.0, 0.0, 0.0, 0.635868836712, -0.038674102345],
        0.42857142857142855,
    ),
    (
        "gspo",
        "tis",
        "seq-mean-token-mean",
        0.5266952666008351,
        [0.0, 0.0, 0.041382108649, 0.0, 0.246894450123, 0.368323238405, 0.607262357651, 0.0],
        0.42857142857142855,
    ),
    (
        "cispo",
        "tis",
        "token-mean",
        -0.26730874481071143,
        [
            -0.548571428571,
            -0.140353843385,
            0.035470378842,
            -0.0,
            0.270927806421,
            0.25261049556,
            0.635868836712,
            -0.038674102345,
        ],
        0.5714285714285714,
    ),
    (
        "topr",
        "none",
        "token-mean",
        -0.15246152246026703,
        [-0.214285714286, -0.214285714286, 0.071428571429, -0.0, 0.285714285714, 0.285714285714, 0.285714285714, -0.1],
        0.5714285714285714,
    ),
    (
        "reinforce",
        "tis",
        "token-mean",
        -0.3999780574843443,
        [
            -0.428571428571,
            -0.175442304231,
            0.032094926008,
            -0.0,
            0.211662348766,
            0.31576311945,
            0.52060537154,
            -0.036787944117,
        ],
        0.0,
    ),
    (
        "ppo",
        "mis",
        "seq-mean-token-mean",
        1.1814004163213765,
        [0.0, -0.151632664928, 0.0, -0.0, 0.0, 0.0, 0.556385232123, -0.0],
        0.42857142857142855,
    ),
    (
        "gspo",
        "none",
        "seq-mean-token-sum",
        2.42482450600852,
        [0.0, 0.0, 0.276292729519, 0.0, 1.333090592163, 1.333090592163, 1.333090592163, 0.0],
        0.42857142857142855,
    ),
    (
        "cispo",
        "mis",
        "seq-mean-token-mean",
        -0.28090938520395836,
        [-0.0, -0.163746150616, 0.0, -0.0, 0.237061830618, 0.221034183615, 0.556385232123, -0.0],
        0.5714285714285714,
    ),
    (
        "topr",
        "none",
        "seq-mean-token-sum",
        -0.5336153286109346,
        [-0.75, -0.75, 0.25, -0.0, 1.0, 1.0, 1.0, -0.35],
        0.5714285714285714,
    ),
    (
        "reinforce",
        "mis",
        "token-mean",
        -0.518729524865284,
        [-0.0, -0.175442304231, 0.0, -0.0, 0.211662348766, 0.31576311945, 0.52060537154, -0.0],
        0.0,
    ),
]


@pytest.mark.parametrize(("objective", "correction", "aggregation", "loss", "grad", "clip_fraction"), FROZEN)
def test_every_objective_gives_its_frozen_loss_and_gradient(
    objective, correction, aggregation, loss, grad, clip_fraction
):
    logp, prox, behaviour, adv, mask = _frozen_tensors()
    # clip_low pinned: the frozen CISPO rows were taken with a clip below, which its default no longer has
    cfg = LossConfig(objective=objective, correction=correction, aggregation=aggregation, clip_low=0.2)
    value, metrics = policy_loss(logp, prox, behaviour, adv, mask, cfg)
    value.backward()
    assert float(value.detach()) == pytest.approx(loss, rel=1e-12, abs=1e-12)
    assert logp.grad.flatten().tolist() == pytest.approx(grad, rel=1e-9, abs=1e-11)
    assert metrics["offpolicy/ratio_clip_fraction"] == pytest.approx(clip_fraction)


def test_ppo_without_dual_clip_with_kl_and_entropy_penalty_keeps_its_frozen_values():
    logp, prox, behaviour, adv, mask = _frozen_tensors()
    cfg = LossConfig(dual_clip=None, kl_coef=0.1, entropy_coef=-0.01)
    value, metrics = policy_loss(
        logp, prox, behaviour, adv, mask, cfg, reference_logp=prox - 0.3, entropy=0.5 + 0.1 * logp
    )
    value.backward()
    assert float(value.detach()) == pytest.approx(1.0058807417787758, rel=1e-12)
    assert logp.grad.flatten().tolist() == pytest.approx(
        [
            0.008009586227,
            -0.12982799851,
            0.040322949613,
            0.0,
            0.788196286446,
            -0.001359584544,
            0.641632684431,
            -0.034312503627,
        ],
        rel=1e-9,
        abs=1e-11,
    )
    assert metrics == pytest.approx(
        {
            "entropy": 0.4096392021901877,
            "kl_reference_k3": 0.18399074223635872,
            "offpolicy/kl_behaviour_prox_k3": 0.20909288695306713,
            "offpolicy/ratio_clip_fraction": 0.2857142857142857,
            "offpolicy/ratio_mean": 1.4438572825212244,
            "offpolicy/w_abs_dev_mean": 0.572876492939249,
            "offpolicy/w_abs_dev_p95": 1.2683576345443726,
            "offpolicy/w_capped_fraction": 0.14285714285714285,
        },
        rel=1e-6,
    )


def test_the_objective_table_holds_every_name_the_config_accepts():
    from typing import get_args

    from rollhub.trainer.losses import OBJECTIVES, Objective

    assert set(OBJECTIVES) == set(get_args(Objective))
    logp, prox, behaviour, adv, mask = _frozen_tensors()
    with pytest.raises(ValueError, match="unknown objective"):
        policy_loss(logp, prox, behaviour, adv, mask, LossConfig(objective="vtrace"))
