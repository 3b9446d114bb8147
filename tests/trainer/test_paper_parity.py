"""Paper parity: every objective, advantage estimator and KL estimator the config offers, against a
reference written here from the paper's equations (never from rollhub's code), fed the same
tensors and compared to 1e-6; for the KL estimators the expected gradient is compared too, since
as losses it is their gradient, not their value, that acts.

Symbols: mu behaviour (the engine's sampler), pi_prox proximal, pi_theta current; r = pi_theta / pi_prox,
w = pi_prox / mu; A advantage; m response mask; sg stop-gradient.
"""

import math

import pytest
import torch

from rollhub.trainer.advantages import gigpo_advantages, grpo_advantages
from rollhub.trainer.losses import LossConfig, behaviour_weight, full_kl, k2_kl, k3_kl, policy_loss
from rollhub.trainer.policy import token_logprobs_from_logits

torch.set_num_threads(1)
TOL = 1e-6


def _tensors(seed=0):
    """Three sequences of 2, 4 and 5 response tokens; per-sequence advantages (GRPO/GSPO/TOPR use one
    A per sequence), pi_theta, pi_prox and mu apart by up to ~0.7 nat, so every clip and band is hit."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.float64)
    prox = -torch.rand(3, 5, generator=g, dtype=torch.float64) * 3 - 0.05
    logp = (prox + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5) * 1.2).requires_grad_(True)
    behaviour = prox + (torch.rand(3, 5, generator=g, dtype=torch.float64) - 0.5) * 1.6
    adv = torch.tensor([1.3, -0.8, -2.1], dtype=torch.float64).unsqueeze(-1).expand(3, 5).clone()
    return logp, prox, behaviour, adv, mask


def _token_mean(x, m):
    return (x * m).sum() / m.sum()


def _seq_mean_token_mean(x, m):
    return ((x * m).sum(-1) / m.sum(-1)).mean()


def _seq_mean_token_sum(x, m):
    return (x * m).sum(-1).mean()


def _ours(cfg, logp, prox, behaviour, adv, mask, **kw):
    loss, _ = policy_loss(logp, prox, behaviour, adv, mask, cfg, **kw)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def _reference(fn, logp):
    loss = fn(logp)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


def _assert_same(ours, ref):
    assert float(ours[0]) == pytest.approx(float(ref[0]), abs=TOL)
    assert torch.allclose(ours[1], ref[1], atol=TOL, rtol=0)


# --- objectives -------------------------------------------------------------------------------


def _ppo_surrogate(r, a, lo, hi):
    """Schulman et al. 2017 (arXiv 1707.06347) Eq. 7 with DAPO's decoupled clip (arXiv 2503.14476 Eq. 8)."""
    return torch.minimum(r * a, torch.clamp(r, 1 - lo, 1 + hi) * a)


def test_ppo_clip_with_clip_higher_token_mean():
    logp, prox, behaviour, adv, mask = _tensors()
    cfg = LossConfig(objective="ppo", correction="none", dual_clip=None, clip_low=0.2, clip_high=0.28)

    def ref(lp):
        return -_token_mean(_ppo_surrogate(torch.exp(lp - prox), adv, 0.2, 0.28), mask)

    _assert_same(_ours(cfg, logp, prox, behaviour, adv, mask), _reference(ref, logp))


def test_dual_clip():
    """Ye et al. 2020 (arXiv 1912.09729) Eq. 5: for A < 0 the objective is max(min(rA, clip(r)A), cA)."""
    logp, prox, behaviour, adv, mask = _tensors(1)
    cfg = LossConfig(objective="ppo", correction="none", dual_clip=1.5, clip_low=0.2, clip_high=0.2)

    def ref(lp):
        r = torch.exp(lp - prox)
        clip = _ppo_surrogate(r, adv, 0.2, 0.2)
        objective = torch.where(adv < 0, torch.maximum(clip, 1.5 * adv), clip)
        return -_token_mean(objective, mask)

    ours = _ours(cfg, logp, prox, behaviour, adv, mask)
    _assert_same(ours, _reference(ref, logp))
    # the floor is hit on some negative token here, so the test can tell dual clip from plain PPO
    r = torch.exp(logp.detach() - prox)
    assert bool(((adv < 0) & (r * adv < 1.5 * adv) & (mask > 0)).any())


def test_decoupled_ppo_as_areal_with_its_behaviour_weight_cap():
    """Hilton et al. 2021 (arXiv 2110.00641) Eq. 5 as AReaL (arXiv 2505.24298) runs it: the clipped surrogate
    on r = pi_theta / pi_prox, times sg(w = pi_prox / mu); AReaL's `behav_imp_weight_cap` C drops the tokens
    with w > C. That is `correction: mis` with the band [0, C]."""
    logp, prox, behaviour, adv, mask = _tensors(2)
    cap = 1.3
    cfg = LossConfig(objective="ppo", correction="mis", mis_low=0.0, mis_high=cap, dual_clip=None)

    def ref(lp):
        w = torch.exp(prox - behaviour)
        w = torch.where(w <= cap, w, torch.zeros_like(w))
        return -_token_mean(w * _ppo_surrogate(torch.exp(lp - prox), adv, 0.2, 0.28), mask)

    _assert_same(_ours(cfg, logp, prox, behaviour, adv, mask), _reference(ref, logp))
    assert bool(((torch.exp(prox - behaviour) > cap) & (mask > 0)).any())  # the cap acts on these tensors


def test_decoupled_ppo_with_truncated_is():
    """Truncated IS (Yao et al. 2025, 'Your efficient RL framework secretly brings you off-policy RL'):
    the decoupled surrogate times sg(min(w, C)); C = 2 is the default."""
    logp, prox, behaviour, adv, mask = _tensors(3)
    cfg = LossConfig(objective="ppo", correction="tis", is_cap=1.2, dual_clip=None)

    def ref(lp):
        w = torch.clamp(torch.exp(prox - behaviour), max=1.2)
        return -_token_mean(w * _ppo_surrogate(torch.exp(lp - prox), adv, 0.2, 0.28), mask)

    _assert_same(_ours(cfg, logp, prox, behaviour, adv, mask), _reference(ref, logp))


def test_masked_is_keeps_the_ratio_inside_the_band():
    """Masked IS (IcePop): tokens whose w leaves [lo, hi] are dropped, the others keep their weight w."""
    w = torch.tensor([[0.4, 0.6, 1.0, 1.8, 2.5]], dtype=torch.float64)
    weight, raw = behaviour_weight(torch.log(w), torch.zeros_like(w), "mis", 2.0, (0.5, 2.0))
    assert weight.flatten().tolist() == pytest.approx([0.0, 0.6, 1.0, 1.8, 0.0], abs=1e-12)
    assert raw.flatten().tolist() == pytest.approx(w.flatten().tolist())

    logp, prox, behaviour, adv, mask = _tensors(4)
    cfg = LossConfig(objective="ppo", correction="mis", mis_low=0.7, mis_high=1.4, dual_clip=None)

    def ref(lp):
        w = torch.exp(prox - behaviour)
        w = w * ((w >= 0.7) & (w <= 1.4))
        return -_token_mean(w * _ppo_surrogate(torch.exp(lp - prox), adv, 0.2, 0.28), mask)

    _assert_same(_ours(cfg, logp, prox, behaviour, adv, mask), _reference(ref, logp))


def test_cispo():
    """MiniMax-M1 (arXiv 2506.13585) Eq. 4: J = 1/sum|o_i| sum_i sum_t sg(clip(r, 1-e_lo, 1+e_hi)) A log pi_theta,
    with r against the sampling policy (here pi_prox = mu); the paper imposes no lower bound (e_lo large), our
    default when loss.clip_low is unset."""
    logp, _, behaviour, adv, mask = _tensors(5)
    cfg = LossConfig(objective="cispo", correction="none", clip_high=0.28)

    def ref(lp):
        r_hat = torch.clamp(torch.exp(lp - behaviour), max=1.28).detach()
        return -_token_mean(r_hat * adv * lp, mask)

    _assert_same(_ours(cfg, logp, behaviour, behaviour, adv, mask), _reference(ref, logp))


def test_reinforce():
    logp, _, behaviour, adv, mask = _tensors(6)
    cfg = LossConfig(objective="reinforce", correction="none")
    _assert_same(
        _ours(cfg, logp, behaviour, behaviour, adv, mask), _reference(lambda lp: -_token_mean(adv * lp, mask), logp)
    )


def _topr_reference(lp, behaviour, adv, mask):
    """Le Roux et al. 2025 (arXiv 2503.14286) Eq. 8: positive trajectories get the plain REINFORCE term,
    negative ones sg(clamp(pi(tau) / mu(tau), 0, 1)) with the TRAJECTORY ratio; a batch average of
    per-trajectory sums."""
    log_pi_tau = (lp * mask).sum(-1)
    log_ratio_tau = ((lp - behaviour) * mask).sum(-1).detach()
    a = adv[:, 0]
    weight = torch.where(a > 0, torch.ones_like(a), torch.clamp(torch.exp(log_ratio_tau), 0.0, 1.0))
    return -(weight * a * log_pi_tau).mean()


def test_topr_as_published():
    logp, prox, behaviour, adv, mask = _tensors(7)
    # a stale negative trajectory with pi/mu > 1 token by token: TOPR caps its weight at 1
    behaviour = behaviour.clone()
    behaviour[1] = logp.detach()[1] - 0.3
    cfg = LossConfig(objective="topr")  # the paper's form needs nothing but the objective
    ours = _ours(cfg, logp, prox, behaviour, adv, mask)
    _assert_same(ours, _reference(lambda lp: _topr_reference(lp, behaviour, adv, mask), logp))
    # the negative sequence 1 (ratio > 1) weighs exactly 1: d loss / d logp = -A / N there
    assert ours[1][1, :4].tolist() == pytest.approx([0.8 / 3] * 4, abs=1e-12)


def test_topr_refuses_a_staleness_weight_on_top():
    with pytest.raises(ValueError, match="topr"):
        LossConfig(objective="topr", correction="tis").validate()


def _gspo_reference(lp, old, adv, mask, lo, hi):
    """Zheng et al. 2025 (arXiv 2507.18071) Eq. 5-7: s_i = (pi_theta(y_i) / pi_old(y_i))^(1/|y_i|),
    J = 1/G sum_i min(s_i A_i, clip(s_i, 1-e_lo, 1+e_hi) A_i)."""
    s = torch.exp(((lp - old) * mask).sum(-1) / mask.sum(-1))
    a = adv[:, 0]
    return -torch.minimum(s * a, torch.clamp(s, 1 - lo, 1 + hi) * a).mean()


def test_gspo_as_published_by_default():
    logp, _, behaviour, adv, mask = _tensors(8)
    # sequence ratios near 1, some beyond the paper's 3e-4 / 4e-4 band and some inside it
    logp = (behaviour + torch.tensor([[6e-4], [-1e-4], [9e-4]], dtype=torch.float64)).requires_grad_(True)
    cfg = LossConfig(objective="gspo", correction="none")
    assert (cfg.gspo_clip_low, cfg.gspo_clip_high) == (3e-4, 4e-4)
    ours = _ours(cfg, logp, behaviour, behaviour, adv, mask)
    _assert_same(ours, _reference(lambda lp: _gspo_reference(lp, behaviour, adv, mask, 3e-4, 4e-4), logp))
    # sequence 0 (ratio e^6e-4 > 1 + 4e-4, A > 0) is clipped: no gradient; sequence 2 (A < 0) is not
    assert float(ours[1][0].abs().sum()) == 0.0
    assert float(ours[1][2].abs().sum()) > 0


def test_gspo_weighs_every_sequence_alike_whatever_its_length():
    """At ratio 1 each sequence's summed gradient is -A_i / G, not proportional to its length."""
    mask = torch.zeros(3, 11, dtype=torch.float64)
    for row, n in enumerate((2, 6, 11)):
        mask[row, :n] = 1.0
    logp = torch.zeros(3, 11, dtype=torch.float64, requires_grad=True)
    adv = torch.ones(3, 11, dtype=torch.float64)
    loss, _ = policy_loss(logp, logp.detach(), logp.detach(), adv, mask, LossConfig(objective="gspo"))
    loss.backward()
    per_sequence = (logp.grad * mask).sum(-1)
    assert per_sequence.tolist() == pytest.approx([-1 / 3] * 3, abs=1e-12)


def test_gspo_refuses_a_token_mean_aggregation():
    with pytest.raises(ValueError, match="gspo"):
        LossConfig(objective="gspo", aggregation="token-mean").validate()
    LossConfig(objective="gspo").validate()
    LossConfig(objective="gspo", aggregation="seq-mean-token-mean").validate()


# --- KL estimators and the entropy bonus -----------------------------------------------------------


def _categorical(seed=0, vocab=7):
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(vocab, generator=g, dtype=torch.float64).requires_grad_(True)
    ref = torch.log_softmax(torch.randn(vocab, generator=g, dtype=torch.float64) * 0.8, -1)
    return theta, ref


def test_exact_kl_is_the_reverse_kl_and_its_gradient():
    theta, ref = _categorical(0)
    logp = torch.log_softmax(theta, -1)
    ours = full_kl(logp.unsqueeze(0), ref.unsqueeze(0)).squeeze(0)
    p = logp.exp()
    expected = sum(p[v] * (logp[v] - ref[v]) for v in range(len(p)))  # KL(pi || ref), by definition
    assert float(ours.detach()) == pytest.approx(float(expected.detach()), abs=1e-12)
    (g_ours,) = torch.autograd.grad(ours, theta, retain_graph=True)
    (g_ref,) = torch.autograd.grad(expected, theta)
    assert torch.allclose(g_ours, g_ref, atol=TOL)


def _expected_gradient(estimator, theta, ref):
    """E_{x ~ pi}[grad of the per-sample loss estimator(x)], summed exactly over the vocabulary."""
    logp = torch.log_softmax(theta, -1)
    per_token = estimator(logp, ref)
    (grad,) = torch.autograd.grad((logp.exp().detach() * per_token).sum(), theta)
    return grad, float((logp.exp() * per_token).sum())


def test_k3_value_is_unbiased_and_its_gradient_is_the_forward_kl():
    """Schulman's k3 = (ref/pi - 1) - log(ref/pi) on x ~ pi: E[k3] = KL(pi || ref), but as a loss its
    expected gradient is that of KL(ref || pi) (the GRPO paper's use of it, arXiv 2402.03300 Eq. 4)."""
    theta, ref = _categorical(1)
    grad, value = _expected_gradient(k3_kl, theta, ref)
    logp = torch.log_softmax(theta, -1)
    reverse = (logp.exp() * (logp - ref)).sum()
    forward = (ref.exp() * (ref - logp)).sum()
    assert value == pytest.approx(float(reverse), abs=1e-12)
    (g_forward,) = torch.autograd.grad(forward, theta, retain_graph=True)
    (g_reverse,) = torch.autograd.grad(reverse, theta)
    assert torch.allclose(grad, g_forward, atol=TOL)
    assert not torch.allclose(grad, g_reverse, atol=1e-3)


def test_k2_gradient_is_the_reverse_kl():
    """k2 = (log pi - log ref)^2 / 2 on x ~ pi: as a loss its expected gradient is exactly that of KL(pi || ref)."""
    theta, ref = _categorical(2)
    grad, _ = _expected_gradient(k2_kl, theta, ref)
    logp = torch.log_softmax(theta, -1)
    (g_reverse,) = torch.autograd.grad((logp.exp() * (logp - ref)).sum(), theta)
    assert torch.allclose(grad, g_reverse, atol=TOL)


def test_k1_would_have_no_expected_gradient():
    """Why k1 = log pi - log ref is not offered as a loss: E_pi[grad k1] = E_pi[grad log pi] = 0."""
    theta, ref = _categorical(3)
    grad, _ = _expected_gradient(lambda lp, r: lp - r, theta, ref)
    assert float(grad.abs().max()) < 1e-12


@pytest.mark.parametrize("estimator", ["k3", "k2"])
def test_sampled_kl_and_entropy_terms_in_the_loss(estimator):
    """Loss = PG + beta * agg(k) - c * agg(H), H = -sum_v p log p at each response position."""
    logp, _, behaviour, adv, mask = _tensors(9)
    reference = behaviour - 0.25
    logits = torch.randn(3, 6, 11, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    ids = torch.randint(0, 11, (3, 6), generator=torch.Generator().manual_seed(10))
    _, entropy = token_logprobs_from_logits(logits, ids, temperature=0.7, with_entropy=True)
    p = torch.softmax(logits[:, :-1] / 0.7, -1)
    h = -(p * torch.log(p)).sum(-1)
    assert torch.allclose(entropy[:, 1:].double(), h, atol=1e-5)  # the trainer's logits are fp32
    entropy = h
    cfg = LossConfig(objective="reinforce", correction="none", kl_coef=0.1, kl_estimator=estimator, entropy_coef=0.03)

    def ref(lp):
        d = reference - lp
        k = torch.exp(d) - d - 1 if estimator == "k3" else 0.5 * d**2
        return -_token_mean(adv * lp, mask) + 0.1 * _token_mean(k, mask) - 0.03 * _token_mean(entropy, mask)

    ours = _ours(cfg, logp, behaviour, behaviour, adv, mask, reference_logp=reference, entropy=entropy)
    _assert_same(ours, _reference(ref, logp))


def test_k3_docstring_names_its_gradient():
    assert "KL(ref || pi)" in (k3_kl.__doc__ or "")
    assert "KL(pi || ref)" in (k2_kl.__doc__ or "")


# --- advantage estimators ---------------------------------------------------------------------------


def _grpo_reference(rewards, std):
    """Shao et al. 2024 (arXiv 2402.03300) sec. 4.1.2: A_i = (R_i - mean R) / std R (unbiased, + 1e-6), or / 1."""
    r = torch.tensor(rewards, dtype=torch.float64)
    scale = r.std(unbiased=True) + 1e-6 if std else 1.0
    return ((r - r.mean()) / scale).tolist()


@pytest.mark.parametrize("std", [False, True])
def test_grpo(std):
    rewards = [1.0, 0.0, 0.3, 0.0, 1.0, 0.7]
    assert grpo_advantages(rewards, normalize_std=std) == pytest.approx(_grpo_reference(rewards, std), abs=TOL)


def _gigpo_reference(rewards, anchors, *, omega, gamma, std, form):
    """Feng et al. 2025 (arXiv 2505.10978) Eq. 3-7: A = A^E(tau) + omega A^S(a_t); A^S compares the discounted
    returns R_t = sum_k gamma^(k-t) r_k of the steps taken from one anchor state; singleton groups give 0.
    form "trajectory": A^E over one value per trajectory (Eq. 3); "step_weighted": one per step row, as
    verl-agent computes it."""

    def norm(values):
        v = torch.tensor(values, dtype=torch.float64)
        scale = (v.std(unbiased=True) + 1e-6) if std else 1.0
        return v.mean(), scale

    totals = [sum(r) for r in rewards]
    rows = totals if form == "trajectory" else [total for total, r in zip(totals, rewards) for _ in r]
    mean, scale = norm(rows)
    episode = [float((total - mean) / scale) for total in totals]
    returns = []
    for r in rewards:
        g = [sum(gamma ** (k - t) * r[k] for k in range(t, len(r))) for t in range(len(r))]
        returns.append(g)
    groups = {}
    for i, keys in enumerate(anchors):
        for t, key in enumerate(keys):
            groups.setdefault(key, []).append(returns[i][t])
    out = []
    for i, keys in enumerate(anchors):
        row = []
        for t, key in enumerate(keys):
            members = groups[key]
            step = 0.0 if len(members) < 2 else float((returns[i][t] - norm(members)[0]) / norm(members)[1])
            row.append(episode[i] + omega * step)
        out.append(row)
    return out


GIGPO_CASE = (
    [[0.0, 0.0, 1.0], [0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0]],
    [["s0", "a", "b"], ["s0", "b"], ["s0", "a", "c", "a"], ["s0", "d", "b"]],
)


@pytest.mark.parametrize("form", ["trajectory", "step_weighted"])
@pytest.mark.parametrize("std", [False, True])
@pytest.mark.parametrize(("omega", "gamma"), [(1.0, 0.95), (0.6, 0.8)])
def test_gigpo(form, std, omega, gamma):
    rewards, anchors = GIGPO_CASE
    ours = gigpo_advantages(rewards, anchors, omega=omega, gamma=gamma, normalize_std=std, episode_baseline=form)
    ref = _gigpo_reference(rewards, anchors, omega=omega, gamma=gamma, std=std, form=form)
    for row_ours, row_ref in zip(ours, ref):
        assert row_ours == pytest.approx(row_ref, abs=TOL)


def test_gigpo_worked_example_of_the_reference_notes():
    """Four ALFWorld trajectories sharing their first observation: wins at steps 3 and 5, two 50-step failures."""
    rewards = [[0.0, 0.0, 10.0], [0.0] * 4 + [10.0], [0.0] * 50, [0.0] * 50]
    anchors = [["s"] + [f"t{i}_{k}" for k in range(1, len(r))] for i, r in enumerate(rewards)]
    first = [row[0] for row in gigpo_advantages(rewards, anchors, omega=1.0, gamma=0.95)]
    assert first == pytest.approx([9.7325, 8.8525, -9.2925, -9.2925], abs=1e-3)


def test_references_are_sensitive_to_their_inputs():
    """The references are not vacuous: a different clip, cap or gamma changes them by far more than 1e-6."""
    logp, prox, _, adv, mask = _tensors()
    a = -_token_mean(_ppo_surrogate(torch.exp(logp.detach() - prox), adv, 0.2, 0.28), mask)
    b = -_token_mean(_ppo_surrogate(torch.exp(logp.detach() - prox), adv, 0.1, 0.1), mask)
    assert abs(float(a - b)) > 1e-3
    rewards, anchors = GIGPO_CASE
    x = _gigpo_reference(rewards, anchors, omega=1.0, gamma=0.95, std=False, form="trajectory")
    y = _gigpo_reference(rewards, anchors, omega=1.0, gamma=0.5, std=False, form="trajectory")
    assert max(abs(p - q) for rp, rq in zip(x, y) for p, q in zip(rp, rq)) > 1e-2
    assert math.isfinite(float(a))
