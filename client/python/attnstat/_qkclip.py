"""QK-Clip's per-head rule (MuonClip, Kimi K2): from each head's measured max logit, the factors
that scale its query and key projection rows so that no head's max logit stays above tau.

Plain Python (no PyTorch, no NumPy): the factors are a handful of floats per layer; a trainer
multiplies its weight rows by them after optimizer.step().

The rule, for a layer of H query heads in groups of G sharing one key/value head (GQA; G = 1 is
multi-head attention, G = H multi-query):

    gamma_h = min(1, tau / S_h)                 S_h: head h's max logit (scaled, as attnstat
                                                measures it); gamma_h = 1 where S_h <= tau, is
                                                unknown (NaN, -inf: no counted row) or +inf (the
                                                logits overflowed: the nonfinite rule's case)
    k_g     = sqrt(max over the group's heads of gamma_h)
    q_h     = gamma_h / k_g

Each head's logits are bilinear in its query and key rows, so they scale by q_h * k_g = gamma_h
exactly: a head over tau is brought to tau, every other head keeps its logits. With G = 1 this is
MuonClip's sqrt(gamma_h) on both projections. With G > 1 the key rows are shared, and scaling them
for one head would clip the group's other heads too; so the group's key rows take the group's
largest factor (the mildest clip: 1, untouched, as soon as one head of the group is under tau, as
MuonClip leaves MLA's shared rotary key alone) and each head's query rows take the rest. No factor
exceeds 1: no weight grows.
"""
import math


def check_tau(tau):
    """tau as a float: finite and > 0, else ValueError."""
    tau = float(tau)
    if not (math.isfinite(tau) and tau > 0.0):
        raise ValueError("tau must be a finite number > 0, not %r" % (tau,))
    return tau


def qk_clip_factors(max_logits, tau, group=1):
    """(q, k): q[h] the factor of query head h's projection rows, k[g] that of key/value group
    g's (heads g*group .. g*group + group - 1), from the heads' max logits (a sequence of
    floats, len a multiple of group) and the threshold tau (finite, > 0)."""
    tau = check_tau(tau)
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError("group (query heads per key/value head) must be an int >= 1, not %r"
                         % (group,))
    s = [float(x) for x in max_logits]
    if len(s) % group:
        raise ValueError("%d heads do not split into groups of %d" % (len(s), group))
    # unknown (NaN, -inf) or unmeasurable (+inf: the logits overflowed) leaves a head untouched
    gamma = [tau / x if math.isfinite(x) and x > tau else 1.0 for x in s]
    top = [max(gamma[g * group:(g + 1) * group]) for g in range(len(s) // group)]
    k = [math.sqrt(t) for t in top]
    # the head that sets its group's key factor takes the same one (MuonClip's sqrt on both sides,
    # bit for bit, where each head is its own group); the others the rest of their gamma
    q = [k[h // group] if gamma[h] == top[h // group] else gamma[h] / k[h // group]
         for h in range(len(s))]
    return q, k
