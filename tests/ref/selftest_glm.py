#!/usr/bin/python3
"""Self-test of the glm4_moe reference and random checkpoints (run: /usr/bin/python3 tests/ref/selftest_glm.py).

* the router on hand-made scores: bias changes the choice but not the weights, group-limited top-k
  keeps only topk_group groups, norm_topk_prob and routed_scaling_factor;
* partial RoPE rotates dims [0, rotary_dim) in NeoX pairs (i, i + rotary_dim/2) and passes the rest;
* one seed gives bit-identical trunk and MTP logits in the HF layout, the HF layout in 3 shards,
  the MLX bf16 layout with an MLX-named sidecar, and the MLX layout with an HF-named sidecar;
  the MLX layout without a sidecar has no MTP layer (as mlx-lm writes it);
* MLX 8-bit and 4-bit quantized checkpoints stay close to bf16;
* the numpy reference and the PyTorch forward (tools/ref/glm4_moe_torch.py) agree on three shapes:
  GLM-4.5-like (qk-norm, biases), Air-like with 3-of-6 expert groups and the MTP layer's own
  embedding and head, and no attention bias with 4 groups and partial_rotary_factor 0.25;
* zeroing the MTP embedding at position 0 changes MTP row 0 only.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "ref"))
from glm4_moe import GlmConfig, GlmReference, partial_rope, route  # noqa: E402


def gen(tmp, name, *args):
    out = os.path.join(tmp, name)
    subprocess.check_call([sys.executable, os.path.join(HERE, "make_random_glm.py"), "--out", out, *args],
                          stderr=subprocess.DEVNULL)
    return out


def check_router():
    base = dict(model_type="glm4_moe", vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                n_routed_experts=6, num_experts_per_tok=2, norm_topk_prob=True, routed_scaling_factor=2.5)
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.1])
    logits = np.log(s / (1 - s))[None].astype(np.float32)
    bias = np.array([0, 0, 0, 0, 0.5, 0], np.float32)
    idx, wt = route(logits, bias, GlmConfig(base))
    assert sorted(idx[0]) == [0, 4], idx                      # bias lifts expert 4 over 1
    np.testing.assert_allclose(wt[0][np.argsort(idx[0])], np.array([0.9, 0.5]) / 1.4 * 2.5, rtol=1e-6)
    # 3 groups of 2: biased group scores 1.7, 1.3, 1.1 -> with topk_group 1 only experts 0, 1
    g = GlmConfig(dict(base, n_group=3, topk_group=1))
    idx, _ = route(logits, np.zeros(6, np.float32), g)
    assert sorted(idx[0]) == [0, 1], idx
    # the group of experts 4, 5 wins on its biased sum (0.5 + 0.5 + 0.1 + 0.9 = 2.0)
    idx, wt = route(logits, np.array([0, 0, 0, 0, 0.5, 0.9], np.float32), g)
    assert sorted(idx[0]) == [4, 5], idx
    np.testing.assert_allclose(sorted(wt[0]), np.array([0.1, 0.5]) / 0.6 * 2.5, rtol=1e-6)
    idx, wt = route(logits, None, GlmConfig(dict(base, norm_topk_prob=False, routed_scaling_factor=1.0)))
    np.testing.assert_allclose(sorted(wt[0]), [0.8, 0.9], rtol=1e-6)
    print("router ok")


def check_rope():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 12)).astype(np.float32)
    pos = np.arange(5) * 7
    y = partial_rope(x, pos, 10000.0, 8)
    assert np.array_equal(y[..., 8:], x[..., 8:])              # unrotated tail
    assert np.allclose(y[0], x[0])                             # position 0 is the identity
    for i in range(4):                                         # pair (i, i + 4) turns by pos * theta^(-2i/8)
        ang = pos * 10000.0 ** (-2 * i / 8)
        z = (x[..., i] + 1j * x[..., i + 4]) * np.exp(1j * ang)[:, None]
        assert np.allclose(y[..., i], z.real, atol=1e-5) and np.allclose(y[..., i + 4], z.imag, atol=1e-5)
    print("partial rope ok")


def torch_parity(d, toks):
    try:
        from glm4_moe_torch import TorchGlm
    except ImportError:
        print("torch not available: no torch parity")
        return
    lg, ml = TorchGlm(d).forward(toks)
    ref = GlmReference(d).forward(toks)
    e1, e2 = np.abs(lg - ref[0]).max(), np.abs(ml - ref[1]).max()
    print("torch vs numpy %s: trunk %.2e, mtp %.2e" % (os.path.basename(d), e1, e2))
    assert e1 < 1e-3 and e2 < 1e-3


def main():
    check_router()
    check_rope()
    toks = [1, 5, 77, 300, 12, 418, 3, 9, 100, 250, 7, 7, 7]
    with tempfile.TemporaryDirectory() as tmp:
        base = GlmReference(gen(tmp, "h", "--layout", "hf", "--seed", "3")).forward(toks)
        assert base[1] is not None and base[1].shape == (len(toks) - 1, 419)
        for name, args in (("h3", ["--layout", "hf", "--shards", "3"]),
                           ("m", ["--layout", "mlx", "--mtp", "sidecar"]),
                           ("mh", ["--layout", "mlx", "--mtp", "sidecar-hf", "--shards", "2"])):
            r = GlmReference(gen(tmp, name, *args, "--seed", "3")).forward(toks)
            assert np.array_equal(r[0], base[0]) and np.array_equal(r[1], base[1]), name
        plain = GlmReference(gen(tmp, "mn", "--layout", "mlx", "--seed", "3"))
        assert not plain.has_mtp and np.array_equal(plain.forward(toks)[0], base[0])
        print("layouts identical ok; logit range %.1f..%.1f, argmax distinct %d"
              % (base[0].min(), base[0].max(), len(set(base[0].argmax(-1)))))
        for bits, floor in ((8, 0.9), (4, 0.6)):
            q = GlmReference(gen(tmp, "q%d" % bits, "--layout", "mlx", "--mtp", "sidecar",
                                 "--quant", "%d:32" % bits, "--seed", "3")).forward(toks)
            agree = (q[0].argmax(-1) == base[0].argmax(-1)).mean()
            magree = (q[1].argmax(-1) == base[1].argmax(-1)).mean()
            print("%d-bit: argmax agreement trunk %.2f mtp %.2f, max |dlogit| %.3f"
                  % (bits, agree, magree, np.abs(q[0] - base[0]).max()))
            assert agree >= floor and magree >= floor
        off = GlmReference(os.path.join(tmp, "h"), mtp_zero_pos0=False).forward(toks)
        assert np.array_equal(off[0], base[0]) and not np.allclose(off[1][0], base[1][0])
        # causal MTP rows: changing row 0's input changes later rows through attention only slightly,
        # but rows never see the future: the last token does not affect earlier rows
        short = GlmReference(os.path.join(tmp, "h")).forward(toks[:-1])
        assert np.allclose(short[1], base[1][:-1], atol=1e-4)
        print("mtp position-0 masking and causality ok")
        torch_parity(os.path.join(tmp, "h"), toks)
        torch_parity(gen(tmp, "air", "--preset", "air", "--experts", "12", "--n-group", "6", "--topk-group", "3",
                         "--mtp-head", "own", "--seed", "5"), toks)
        torch_parity(gen(tmp, "nb", "--attn-bias", "0", "--experts", "16", "--n-group", "4", "--topk-group", "2",
                         "--topk", "4", "--partial-rotary", "0.25", "--heads", "5", "--kv-heads", "1",
                         "--seed", "6"), toks)
    print("selftest_glm ok")


if __name__ == "__main__":
    main()
