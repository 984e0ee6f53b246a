#!/usr/bin/python3
"""Self-test of the MLA reference and random checkpoints (run: /usr/bin/python3 tests/ref/selftest_mla.py).

* interleaved RoPE turns pairs (2i, 2i+1) by pos * theta^(-2i/d); YaRN's ramp, frequencies and
  attention factor on hand-computed numbers; the softmax scale's mscale^2;
* configs the reference does not model (rope_interleave false, attention biases, an explicit
  attention_factor, num_key_value_heads != heads, partial_rotary_factor != 1) are refused by name;
* mlx-lm's embed_q / unembed_out split folds back into kv_b_proj exactly;
* the absorbed form (key half folded into the query, value half applied after attention over the
  latent cache, as the engine decodes) gives the naive attention's output on a real layer;
* for both families, one seed gives bit-identical trunk and MTP logits in the HF layout, HF in 3
  shards, MLX bf16 with an MLX-named sidecar, MLX with an HF-named sidecar; MLX without a sidecar
  has no MTP layer; MLX 8- and 4-bit stay close to bf16, and group 64 leaves embed_q (input nope =
  32) unquantized while unembed_out (input kv_lora = 64) is quantized;
* zeroing the MTP embedding at position 0 changes MTP row 0 only, and MTP rows are causal;
* the command line writes what forward() and greedy() return;
* the numpy reference and the PyTorch forward (tools/ref/mla_torch.py, transformers' way) agree on
  GLM-4.7-Flash-like, DeepSeek-like (q_lora null, 2 of 4 groups, YaRN, own head) and YaRN with
  mscale != mscale_all_dim shapes.
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train"))
from mla import MlaConfig, MlaReference, fold_mlx_kv_b, rope_interleaved, rope_inv_freq  # noqa: E402
from glm4_moe import rms_norm  # noqa: E402
from safetensors_io import read_header  # noqa: E402

TOKS = [1, 5, 77, 300, 12, 418, 3, 9, 100, 250, 7, 7, 7, 64, 33, 200, 401]


def gen(tmp, name, *args):
    out = os.path.join(tmp, name)
    subprocess.check_call([sys.executable, os.path.join(HERE, "make_random_mla.py"), "--out", out, *args],
                          stderr=subprocess.DEVNULL)
    return out


def base_cfg(**kw):
    d = dict(model_type="deepseek_v3", vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
             n_routed_experts=4, q_lora_rank=None, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=16,
             v_head_dim=4, rope_theta=10000.0)
    d.update(kw)
    return d


def check_rope():
    cfg = MlaConfig(base_cfg())
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 16)).astype(np.float32)
    pos = np.arange(5) * 7
    y = rope_interleaved(x, pos, cfg)
    assert np.allclose(y[0], x[0])
    for i in range(8):
        z = (x[..., 2 * i] + 1j * x[..., 2 * i + 1]) * np.exp(1j * pos * 10000.0 ** (-2 * i / 16))[:, None]
        assert np.allclose(y[..., 2 * i], z.real, atol=1e-5) and np.allclose(y[..., 2 * i + 1], z.imag, atol=1e-5)
    # YaRN, d 16, theta 1e4, original 64, factor 40: correction dims floor(-0.99) -> 0, ceil(2.02) = 3,
    # so the ramp is i/3 over frequencies 0..3: [0, 1/3, 2/3, 1, 1, ...]
    ys = dict(type="yarn", factor=40, beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=0.5,
              original_max_position_embeddings=64)
    cfg = MlaConfig(base_cfg(rope_scaling=ys))
    inv, af = rope_inv_freq(cfg)
    extra = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    ramp = np.clip(np.arange(8) / 3, 0, 1)
    np.testing.assert_allclose(inv, extra / 40 * ramp + extra * (1 - ramp), rtol=1e-12)
    assert inv[0] == extra[0] and np.allclose(inv[3:], extra[3:] / 40)
    assert math.isclose(af, (0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1), rel_tol=1e-12)
    m = 0.05 * math.log(40) + 1
    assert math.isclose(cfg.softmax_scale, 20 ** -0.5 * m * m, rel_tol=1e-12)
    assert MlaConfig(base_cfg()).softmax_scale == 20 ** -0.5
    # DeepSeek-V3's own values: mscale = mscale_all_dim = 1 -> attention factor 1, scale x mscale^2
    cfg = MlaConfig(base_cfg(rope_scaling=dict(ys, mscale_all_dim=1.0, original_max_position_embeddings=4096)))
    assert rope_inv_freq(cfg)[1] == 1.0 and math.isclose(cfg.softmax_scale, 20 ** -0.5 * (0.1 * math.log(40) + 1) ** 2)
    y2 = rope_interleaved(x, pos, cfg)
    assert not np.allclose(y2, y)
    print("interleaved rope, yarn ramp / attention factor / softmax scale ok")


def check_config_errors():
    bad = [dict(rope_interleave=False), dict(attention_bias=True), dict(num_key_value_heads=1),
           dict(rope_scaling=dict(type="yarn", factor=4, attention_factor=1.2, original_max_position_embeddings=64)),
           dict(rope_scaling=dict(type="yarn", factor=4)), dict(rope_scaling=dict(type="dynamic", factor=4)),
           dict(qk_rope_head_dim=15), dict(model_type="glm4_moe"), dict(kv_lora_rank=None),
           dict(mlp_layer_types=["sparse"], first_k_dense_replace=1), dict(partial_rotary_factor=0.5)]
    for kw in bad:
        try:
            MlaConfig(base_cfg(**kw))
        except ValueError as e:
            assert "config.json" in str(e), e
            continue
        raise AssertionError(f"accepted {kw}")
    print("config refusals ok")


def check_fold():
    cfg = MlaConfig(base_cfg(num_attention_heads=3, kv_lora_rank=6, qk_nope_head_dim=4, v_head_dim=5))
    rng = np.random.default_rng(1)
    kvb = rng.standard_normal((3 * 9, 6)).astype(np.float32)
    per = kvb.reshape(3, 9, 6)
    w = {"x.self_attn.embed_q.weight": per[:, :4].transpose(0, 2, 1).copy(), "x.self_attn.unembed_out.weight":
         per[:, 4:].copy()}
    fold_mlx_kv_b(w, cfg)
    assert list(w) == ["x.self_attn.kv_b_proj.weight"] and np.array_equal(w["x.self_attn.kv_b_proj.weight"], kvb)
    try:
        fold_mlx_kv_b({"x.self_attn.embed_q.weight": per[:, :4].transpose(0, 2, 1)}, cfg)
        raise AssertionError("a lone embed_q was accepted")
    except KeyError as e:
        assert "unembed_out" in str(e)
    print("embed_q / unembed_out fold ok")


def check_absorbed(ref):
    """Naive attention of layer 0 against the absorbed (latent-cache) form computed here."""
    c, w = ref.cfg, ref.w
    rng = np.random.default_rng(2)
    x = rng.standard_normal((9, c.hidden_size)).astype(np.float32)
    pos = np.arange(9)
    naive = ref.attention("model.layers.0.", x, pos)
    a = "model.layers.0.self_attn."
    H, dn, dr, dv, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    if c.q_lora_rank:
        q = rms_norm(x @ w[a + "q_a_proj.weight"].T, w[a + "q_a_layernorm.weight"], c.rms_norm_eps) @ w[a + "q_b_proj.weight"].T
    else:
        q = x @ w[a + "q_proj.weight"].T
    q = q.reshape(9, H, dn + dr)
    ckv = x @ w[a + "kv_a_proj_with_mqa.weight"].T
    cache_lat = rms_norm(ckv[:, :r], w[a + "kv_a_layernorm.weight"], c.rms_norm_eps)      # [T, r]
    cache_pe = rope_interleaved(ckv[:, r:], pos, c)                                       # [T, dr]
    kvb = w[a + "kv_b_proj.weight"].reshape(H, dn + dv, r).astype(np.float64)
    q_pe = rope_interleaved(q[..., dn:], pos, c)
    out = np.zeros((9, H, dv))
    for h in range(H):
        q_lat = q[:, h, :dn].astype(np.float64) @ kvb[h, :dn]                            # [T, r]
        s = (q_lat @ cache_lat.T + q_pe[:, h] @ cache_pe.T) * c.softmax_scale
        s = s + np.triu(np.full((9, 9), -np.inf), 1)
        p = np.exp(s - s.max(-1, keepdims=True))
        out[:, h] = ((p / p.sum(-1, keepdims=True)) @ cache_lat) @ kvb[h, dn:].T
    absorbed = out.reshape(9, H * dv) @ w[a + "o_proj.weight"].T.astype(np.float64)
    err = np.abs(absorbed - naive).max()
    print("absorbed vs naive attention (%s): max |d| %.2e of %.2f" % (c.model_type, err, np.abs(naive).max()))
    assert err < 1e-4 * max(1.0, np.abs(naive).max())


def check_layouts(tmp, fam):
    base = MlaReference(gen(tmp, fam + "-h", "--family", fam, "--seed", "3"))
    check_absorbed(base)
    ref = base.forward(TOKS)
    assert ref[1] is not None and ref[1].shape == (len(TOKS) - 1, 419) and ref[0].shape == (len(TOKS), 419)
    for name, args in (("h3", ["--layout", "hf", "--shards", "3"]),
                       ("m", ["--layout", "mlx", "--mtp", "sidecar"]),
                       ("mi", ["--layout", "mlx", "--mtp", "inline", "--shards", "2"]),
                       ("mh", ["--layout", "mlx", "--mtp", "sidecar-hf", "--shards", "2"])):
        r = MlaReference(gen(tmp, f"{fam}-{name}", "--family", fam, *args, "--seed", "3")).forward(TOKS)
        assert np.array_equal(r[0], ref[0]) and np.array_equal(r[1], ref[1]), (fam, name)
    plain = MlaReference(gen(tmp, fam + "-mn", "--family", fam, "--layout", "mlx", "--seed", "3"))
    assert not plain.has_mtp and np.array_equal(plain.forward(TOKS)[0], ref[0])
    print("%s layouts identical ok; logit range %.1f..%.1f, argmax distinct %d"
          % (fam, ref[0].min(), ref[0].max(), len(set(ref[0].argmax(-1)))))
    for bits, gs, floor in ((8, 32, 0.99), (4, 32, 0.9), (4, 64, 0.9)):
        d = gen(tmp, f"{fam}-q{bits}-{gs}", "--family", fam, "--layout", "mlx", "--mtp", "sidecar",
                "--quant", f"{bits}:{gs}", "--seed", "3")
        hdr = read_header(os.path.join(d, "model.safetensors"))[0]
        eq, uo = hdr["model.layers.0.self_attn.embed_q.weight"], hdr["model.layers.0.self_attn.unembed_out.weight"]
        assert eq["dtype"] == ("U32" if gs == 32 else "BF16") and uo["dtype"] == "U32", (eq, uo)
        assert uo["shape"] == [5, 24, 64 * bits // 32] and hdr["model.layers.0.self_attn.unembed_out.scales"]["shape"] \
            == [5, 24, 64 // gs]
        assert hdr["model.layers.3.mlp.gate.weight"]["dtype"] == "BF16"        # the router stays unquantized
        q = MlaReference(d).forward(TOKS)
        # argmax agreement is fragile on random logits; the correlation of the logits is not
        corr = [np.corrcoef(q[i].ravel(), ref[i].ravel())[0, 1] for i in (0, 1)]
        agree = (q[0].argmax(-1) == ref[0].argmax(-1)).mean()
        print("%s %d-bit g%d: logit correlation trunk %.4f mtp %.4f, argmax agreement %.2f, max |dlogit| %.3f"
              % (fam, bits, gs, corr[0], corr[1], agree, np.abs(q[0] - ref[0]).max()))
        assert min(corr) >= floor and corr[0] < 1.0
    hd = os.path.join(tmp, fam + "-h")
    off = MlaReference(hd, mtp_zero_pos0=False).forward(TOKS)
    assert np.array_equal(off[0], ref[0]) and not np.allclose(off[1][0], ref[1][0])
    short = MlaReference(hd).forward(TOKS[:-1])
    assert np.allclose(short[1], ref[1][:-1], atol=1e-4) and np.allclose(short[0], ref[0][:-1], atol=1e-4)
    print("%s mtp position-0 masking and causality ok" % fam)


def check_cli(tmp, d):
    """tools/ref/mla.py's command line writes what forward() and greedy() return."""
    outs = [os.path.join(tmp, n + ".npy") for n in ("l", "m", "pre", "post")]
    r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "ref", "mla.py"), "--model", d,
                        "--tokens", ",".join(map(str, TOKS)), "--logits", outs[0], "--mtp-logits", outs[1],
                        "--hidden-pre", outs[2], "--hidden-post", outs[3], "--greedy", "4"],
                       capture_output=True, text=True, check=True)
    ref = MlaReference(d)
    want = ref.forward(TOKS)
    assert all(np.array_equal(np.load(o), w) for o, w in zip(outs, want))
    assert r.stdout.split() == [str(x) for x in ref.greedy(TOKS, 4)]
    print("command line ok")


def torch_parity(d):
    try:
        from mla_torch import TorchMla
    except ImportError:
        print("torch not available: no torch parity")
        return
    lg, ml = TorchMla(d).forward(TOKS)
    ref = MlaReference(d).forward(TOKS)
    e1, e2 = np.abs(lg - ref[0]).max(), np.abs(ml - ref[1]).max()
    cfg = json.load(open(os.path.join(d, "config.json")))
    print("torch vs numpy %s (%s, q_lora %s, groups %d/%d, rope_scaling %s): trunk %.2e, mtp %.2e"
          % (os.path.basename(d), cfg["model_type"], cfg["q_lora_rank"], cfg["topk_group"], cfg["n_group"],
             (cfg["rope_scaling"] or {}).get("factor"), e1, e2))
    assert e1 < 1e-3 and e2 < 1e-3


def main():
    check_rope()
    check_config_errors()
    check_fold()
    with tempfile.TemporaryDirectory() as tmp:
        for fam in ("glm4_moe_lite", "deepseek_v3"):
            check_layouts(tmp, fam)
        check_cli(tmp, os.path.join(tmp, "glm4_moe_lite-h"))
        torch_parity(os.path.join(tmp, "glm4_moe_lite-h"))
        torch_parity(gen(tmp, "ds-groups-yarn", "--family", "deepseek_v3", "--q-lora-rank", "0", "--experts", "16",
                         "--n-group", "4", "--topk-group", "2", "--topk", "4", "--yarn", "40", "--mtp-head", "own",
                         "--seed", "5"))
        torch_parity(gen(tmp, "glm-yarn-mscale", "--family", "glm4_moe_lite", "--yarn", "16", "--mscale", "1.0",
                         "--mscale-all-dim", "0.6", "--heads", "3", "--nope", "24", "--v-dim", "40",
                         "--seed", "6"))
        # the YaRN model really differs from the same weights without rope scaling
        d = os.path.join(tmp, "ds-groups-yarn")
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        with_yarn = MlaReference(d).forward(TOKS)[0]
        cfg["rope_scaling"] = None
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        assert np.abs(MlaReference(d).forward(TOKS)[0] - with_yarn).max() > 0.1
    print("selftest_mla ok")


if __name__ == "__main__":
    main()
