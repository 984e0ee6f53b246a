#!/usr/bin/python3
"""Self-test of the Gated-DeltaNet hybrid reference and random checkpoints
(run: /usr/bin/python3 tests/ref/selftest_qwen35.py).

* the delta rule on hand-computed numbers (decay, S^T k, the k delta^T update, S^T q);
* the recurrence (tools/ref/qwen35.py) and the chunked algorithm (tools/ref/qwen35_torch.py,
  transformers' torch_chunk_gated_delta_rule) agree on 150 tokens over several chunk sizes, from a
  zero and a non-zero initial state, and the chunked form continued over two calls equals one call;
* Qwen3-Next's fused in_proj_qkvz / in_proj_ba split by key head; fused gate_up_proj split gate first;
* configs the reference does not model are refused by name (config.json: ...);
* for both families, one seed gives bit-identical trunk and MTP logits in HF, HF in 3 shards, MLX
  bf16 with an MLX-named sidecar (folded norms) and MLX with an HF-named sidecar; MLX without a
  sidecar has no MTP head; the files are named as the real checkpoints (qwen3_5_moe: VL wrapper
  config, model.language_model., fused trunk experts; MLX conv1d [C, K, 1]); MLX 8- and 4-bit stay
  close to bf16, the routers quantized at 8 bits group 64 when the hidden size divides by 64;
* prefill then token-by-token decode (the conv window, S and the keys/values carried over) gives one
  prefill's logits, for the trunk and for MTP rows;
* the numpy reference and the PyTorch forward agree on both families, at 70 tokens (past one chunk)
  and at chunk sizes 64 and 5; the command line writes what forward() and greedy() return;
* qwen3_5_moe with full attention every 4th layer and qwen3_next of one seed give the same bits
  (the fused and the split DeltaNet projections, the fused and the per-expert experts);
* an --agree checkpoint's teacher-forced head mostly predicts what the trunk predicts next.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "ref"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "train"))
from qwen35 import Qwen35Config, Qwen35Reference, gated_delta_rule, split_fused  # noqa: E402
from qwen35_torch import TorchQwen35, chunk_gated_delta_rule  # noqa: E402
from safetensors_io import read_header  # noqa: E402

TOKS = [1, 5, 77, 300, 12, 418, 3, 9, 100, 250, 7, 7, 7, 64, 33, 200, 401]
FAMILIES = ("qwen3_5_moe", "qwen3_next")


def gen(tmp, name, *args):
    out = os.path.join(tmp, name)
    subprocess.check_call([sys.executable, os.path.join(HERE, "make_random_qwen35.py"), "--out", out, *args],
                          stderr=subprocess.DEVNULL)
    return out


def rel(a, b):
    return float(np.abs(a - b).max() / (b.max() - b.min()))


def check_delta_rule():
    f = np.float32
    q = np.array([[[1, 1]], [[0, 1]]], f)
    k = np.array([[[1, 0]], [[0.6, 0.8]]], f)
    v = np.array([[[2, 4]], [[1, 1]]], f)
    g = np.log(np.array([[1.0], [0.5]], f))
    beta = np.array([[0.5], [1.0]], f)
    o, S = gated_delta_rule(q, k, v, g, beta)
    # t0: delta = 0.5 [2, 4], S = k delta^T = [[1, 2], [0, 0]], o = S^T q = [1, 2]
    # t1: S = 0.5 S = [[.5, 1], [0, 0]], S^T k = [.3, .6], delta = [.7, .4], S += k delta^T
    np.testing.assert_allclose(o[0, 0], [1, 2], rtol=1e-6)
    np.testing.assert_allclose(S[0], [[0.92, 1.24], [0.56, 0.32]], rtol=1e-6)
    np.testing.assert_allclose(o[1, 0], [0.56, 0.32], rtol=1e-6)
    rng = np.random.default_rng(5)
    T, H, dk, dv = 150, 3, 16, 12

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)
    q = (unit(rng.standard_normal((T, H, dk))) * dk ** -0.5).astype(f)
    k = unit(rng.standard_normal((T, H, dk))).astype(f)
    v = rng.standard_normal((T, H, dv)).astype(f)
    g = -rng.uniform(0.001, 2.0, (T, H)).astype(f)
    beta = rng.uniform(0, 1, (T, H)).astype(f)
    S0 = rng.standard_normal((H, dk, dv)).astype(f)
    for init in (None, S0):
        o, S = gated_delta_rule(q, k, v, g, beta, None if init is None else init.copy())
        tq = torch.from_numpy(q * np.float32(dk ** 0.5))      # the chunked form scales q itself
        for cs in (64, 16, 7, 1):
            oc, Sc = chunk_gated_delta_rule(tq, torch.from_numpy(k), torch.from_numpy(v), torch.from_numpy(g),
                                            torch.from_numpy(beta), cs,
                                            None if init is None else torch.from_numpy(init))
            assert np.abs(oc.numpy() - o).max() < 2e-4 and np.abs(Sc.numpy() - S).max() < 2e-4, cs
        o1, S1 = chunk_gated_delta_rule(tq[:100], torch.from_numpy(k[:100]), torch.from_numpy(v[:100]),
                                        torch.from_numpy(g[:100]), torch.from_numpy(beta[:100]), 64,
                                        None if init is None else torch.from_numpy(init))
        o2, S2 = chunk_gated_delta_rule(tq[100:], torch.from_numpy(k[100:]), torch.from_numpy(v[100:]),
                                        torch.from_numpy(g[100:]), torch.from_numpy(beta[100:]), 64, S1)
        assert np.abs(torch.cat([o1, o2]).numpy() - o).max() < 2e-4 and np.abs(S2.numpy() - S).max() < 2e-4
    print("delta rule: hand numbers, recurrence = chunked (64/16/7/1, zero and given state, split in two) ok")


def check_fused_split():
    d = dict(model_type="qwen3_next", vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
             num_key_value_heads=1, head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
             linear_key_head_dim=2, linear_value_head_dim=3, linear_conv_kernel_dim=4, num_experts=2,
             num_experts_per_tok=1, moe_intermediate_size=2, shared_expert_intermediate_size=2,
             full_attention_interval=1)
    cfg = Qwen35Config(d)
    # rows labelled by (key head h, part, index): q 2 + k 2 + v 2x3 + z 2x3 = 16 rows per key head
    rows = []
    for h in range(2):
        rows += [("q", h * 2 + i) for i in range(2)] + [("k", h * 2 + i) for i in range(2)]
        rows += [("v", h * 6 + i) for i in range(6)] + [("z", h * 6 + i) for i in range(6)]
    code = {"q": 0, "k": 100, "v": 200, "z": 300}
    qkvz = np.array([[code[p] + i] * 4 for p, i in rows], np.float32)
    ba = np.array([[0 + 0] * 4, [1] * 4, [100] * 4, [101] * 4, [2] * 4, [3] * 4, [102] * 4, [103] * 4], np.float32)
    w = {"x.linear_attn.in_proj_qkvz.weight": qkvz, "x.linear_attn.in_proj_ba.weight": ba}
    split_fused(w, cfg)
    col = {k: v[:, 0].tolist() for k, v in w.items()}
    assert col["x.linear_attn.in_proj_qkv.weight"] == [0, 1, 2, 3, 100, 101, 102, 103] + [200 + i for i in range(12)]
    assert col["x.linear_attn.in_proj_z.weight"] == [300 + i for i in range(12)]
    assert col["x.linear_attn.in_proj_b.weight"] == [0, 1, 2, 3] and col["x.linear_attn.in_proj_a.weight"] == [
        100, 101, 102, 103]
    bad = [dict(model_type="qwen3"), dict(linear_num_value_heads=3), dict(attention_bias=True),
           dict(hidden_act="gelu"), dict(mlp_only_layers=[0]), dict(decoder_sparse_step=2),
           dict(rope_scaling=dict(type="yarn", factor=4)), dict(layer_types=["mamba"]), dict(head_dim=None),
           dict(partial_rotary_factor=0.125), dict(linear_conv_kernel_dim=1), dict(mtp_num_hidden_layers=2),
           dict(num_experts_per_tok=3)]
    for kw in bad:
        try:
            Qwen35Config(dict(d, **kw))
        except ValueError as e:
            assert "config.json" in str(e), e
            continue
        raise AssertionError(f"accepted {kw}")
    try:
        Qwen35Config(dict(model_type="qwen3_5_moe", text_config=None))
        raise AssertionError("qwen3_5_moe without text_config accepted")
    except ValueError as e:
        assert "text_config" in str(e)
    print("fused qkvz / ba split, config refusals ok")


def check_layouts(tmp, fam, seed):
    f = ["--family", fam, "--seed", str(seed)]
    d = {n: gen(tmp, f"{fam}-{n}", *f, *a) for n, a in (
        ("hf", ["--layout", "hf"]), ("hf3", ["--layout", "hf", "--shards", "3"]),
        ("mlx", ["--layout", "mlx", "--mtp", "sidecar"]), ("mlxh", ["--layout", "mlx", "--mtp", "sidecar-hf"]),
        ("mlx-none", ["--layout", "mlx"]), ("q8", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "8:32"]),
        ("q4", ["--layout", "mlx", "--mtp", "sidecar", "--quant", "4:32"]))}
    hdr = read_header(os.path.join(d["hf"], "model.safetensors"))[0]
    with open(os.path.join(d["hf"], "config.json")) as fh:
        cfg = json.load(fh)
    mhdr = read_header(os.path.join(d["mlx"], "model.safetensors"))[0]
    if fam == "qwen3_5_moe":
        assert "text_config" in cfg and cfg["text_config"]["layer_types"][1] == "full_attention"
        assert hdr["model.language_model.layers.1.mlp.experts.gate_up_proj"]["shape"] == [8, 192, 160]
        assert "mtp.layers.0.mlp.experts.7.down_proj.weight" in hdr and "lm_head.weight" in hdr
        assert mhdr["language_model.model.layers.0.linear_attn.conv1d.weight"]["shape"] == [224, 4, 1]
        assert "language_model.lm_head.weight" in mhdr
    else:
        assert "text_config" not in cfg and cfg["full_attention_interval"] == 4
        assert hdr["model.layers.0.linear_attn.in_proj_qkvz.weight"]["shape"] == [352, 160]
        assert hdr["model.layers.0.linear_attn.conv1d.weight"]["shape"] == [224, 1, 4]
        assert "model.layers.3.mlp.experts.7.up_proj.weight" in hdr
    assert hdr[[k for k in hdr if k.endswith("A_log")][0]]["dtype"] == "F32"
    ref = {n: Qwen35Reference(p) for n, p in d.items()}
    base = ref["hf"].forward(TOKS)
    for n in ("hf3", "mlx", "mlxh"):
        o = ref[n].forward(TOKS)
        assert np.array_equal(o[0], base[0]) and np.array_equal(o[1], base[1]), f"{fam} {n} differs from hf"
    assert not ref["mlx-none"].has_mtp and np.array_equal(ref["mlx-none"].forward(TOKS)[0], base[0])
    corr = {}
    for n, floor in (("q8", 0.99), ("q4", 0.9)):
        o = ref[n].forward(TOKS)
        corr[n] = [float(np.corrcoef(o[i].ravel(), base[i].ravel())[0, 1]) for i in (0, 1)]
        assert min(corr[n]) >= floor, (fam, n, corr[n])
    print(f"{fam}: hf = 3 shards = mlx + sidecar = mlx + hf sidecar bit for bit; logit correlation "
          f"trunk / MTP q8 {corr['q8'][0]:.4f} / {corr['q8'][1]:.4f}, q4 {corr['q4'][0]:.4f} / {corr['q4'][1]:.4f} ok")
    return ref["hf"], d["hf"]


def check_router_quant(tmp):
    d = gen(tmp, "wide-q4", "--family", "qwen3_5_moe", "--layout", "mlx", "--quant", "4:32", "--hidden", "256",
            "--mtp", "sidecar")
    h = read_header(os.path.join(d, "model.safetensors"))[0]
    assert h["language_model.model.layers.0.mlp.gate.weight"]["shape"] == [8, 256 * 8 // 32]
    assert h["language_model.model.layers.0.mlp.shared_expert_gate.scales"]["shape"] == [1, 4]
    with open(os.path.join(d, "config.json")) as f:
        q = json.load(f)["quantization"]
    assert q["mtp.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8}
    hf = gen(tmp, "wide-hf", "--family", "qwen3_5_moe", "--layout", "hf", "--hidden", "256")
    a, b = Qwen35Reference(d).forward(TOKS)[1], Qwen35Reference(hf).forward(TOKS)[1]
    e = float(np.corrcoef(a.ravel(), b.ravel())[0, 1])
    assert e >= 0.9, e
    print(f"routers at 8:64 (hidden 256); q4 MTP logit correlation {e:.4f} ok")


def check_incremental(ref, fam):
    full = ref.forward(TOKS)
    st = ref.new_state()
    rows, hs = [], []
    lg, _, hp = ref.trunk(TOKS[:5], st)
    rows.append(lg)
    hs.append(hp)
    for t in TOKS[5:]:
        lg, _, hp = ref.trunk([t], st)
        rows.append(lg)
        hs.append(hp)
    inc = np.concatenate(rows)
    assert rel(inc, full[0]) < 1e-5, rel(inc, full[0])
    h = np.concatenate(hs)
    mst, mrows = {}, []
    m, _ = ref.mtp(TOKS[:6], h[:6], 0, mst)
    mrows.append(m)
    for p in range(6, len(TOKS)):
        m, _ = ref.mtp(TOKS[p - 1:p + 1], h[p - 1:p + 1], p - 1, mst)
        mrows.append(m)
    minc = np.concatenate(mrows)
    assert rel(minc, full[1]) < 1e-5, rel(minc, full[1])
    print(f"{fam}: prefill 5 then decode 1 by 1 = one prefill (trunk {rel(inc, full[0]):.1e}, "
          f"MTP {rel(minc, full[1]):.1e}) ok")


def check_torch(ref, mdir, fam):
    toks = (TOKS * 5)[:70]
    a = ref.forward(toks)
    for cs in (64, 5):
        b = TorchQwen35(mdir, cs).forward(toks)
        e1, e2 = rel(b[0], a[0]), rel(b[1], a[1])
        assert e1 < 1e-5 and e2 < 1e-5, (fam, cs, e1, e2)
    print(f"{fam}: numpy recurrence = PyTorch chunked at 70 tokens (chunk 64 and 5) ok")


def check_cli(tmp, ref, mdir):
    lp, mp = os.path.join(tmp, "l.npy"), os.path.join(tmp, "m.npy")
    r = subprocess.run([sys.executable, os.path.join(HERE, "..", "..", "tools", "ref", "qwen35.py"), "--model", mdir,
                        "--tokens", ",".join(map(str, TOKS[:6])), "--logits", lp, "--mtp-logits", mp, "--greedy", "4"],
                       capture_output=True, text=True, check=True)
    lg, m, _, _ = ref.forward(TOKS[:6])
    assert np.array_equal(np.load(lp), lg) and np.array_equal(np.load(mp), m)
    assert r.stdout.split() == [str(x) for x in ref.greedy(TOKS[:6], 4)]
    print("command line ok")


def check_cross_family(tmp):
    """qwen3_5_moe with full attention every 4th layer and qwen3_next of one seed hold the same
    weights (Qwen3-Next's fused qkvz / ba and per-expert files, Qwen3.5's split projections and fused
    gate_up_proj): the same logits."""
    a, b = (Qwen35Reference(gen(tmp, f"x-{fam}", "--family", fam, "--interval", "4", "--seed", "9")).forward(TOKS)
            for fam in FAMILIES)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    print("qwen3_5_moe (interval 4) = qwen3_next of one seed, bit for bit ok")


def check_agree(tmp):
    for fam in FAMILIES:
        d = gen(tmp, f"{fam}-agree", "--family", fam, "--layout", "hf", "--agree", "0.05", "--seed", "21")
        lg, m, _, _ = Qwen35Reference(d).forward(TOKS)
        hit = float((m.argmax(-1) == lg[1:].argmax(-1)).mean())
        assert hit >= 0.6, (fam, hit)
        print(f"{fam} --agree 0.05: the head predicts the trunk's next token on {hit:.0%} of rows ok")


def main():
    check_delta_rule()
    check_fused_split()
    with tempfile.TemporaryDirectory(prefix="selftest-qwen35-") as tmp:
        for i, fam in enumerate(FAMILIES):
            ref, mdir = check_layouts(tmp, fam, 7 + i)
            check_incremental(ref, fam)
            check_torch(ref, mdir, fam)
            if i == 0:
                check_cli(tmp, ref, mdir)
        check_router_quant(tmp)
        check_cross_family(tmp)
        check_agree(tmp)
    print("selftest_qwen35 ok")


if __name__ == "__main__":
    main()
