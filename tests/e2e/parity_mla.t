#!/usr/bin/python3
"""End-to-end parity of the C engine's multi-head latent attention families, GLM-4.7-Flash
(glm4_moe_lite) and DeepSeek-V3 / V3.1 (deepseek_v3), against the independent float32 reference
forward (tools/ref/mla.py, naive non-absorbed attention) on random checkpoints of odd shapes
(tests/ref/make_random_mla.py: 5 heads, hidden != heads x v_head_dim, qk_nope != v_head_dim,
q_lora_rank set and null, expert groups with topk_group < n_group, YaRN with mscale, one or two dense
layers, the MTP head's own embedding and output head or the trunk's) in the HF layout (plain and
sharded), the MLX layout in bf16 (kv_b_proj split into embed_q / unembed_out as mlx-lm writes it)
and MLX affine 2/3/4/8-bit (group 64 leaves embed_q unquantized), and as `nextn convert` /
`nextn graft` write them, for both families:
  trunk and teacher-forced MTP logits within a small share of the logit range; the same greedy
  continuation; greedy MTP equal to greedy AR at draft 1, 2, 3 and auto, with drafts accepted on a
  checkpoint whose head agrees with its trunk; the HF and MLX layouts of one seed giving the same
  bits; decoding after a prefill (`nextn run`, latent cache) picking what one prefill over the whole
  sequence (`nextn eval`) ranks first; and `nextn inspect --json` reporting the MLA shapes, the rope,
  the latent cache size against full keys and values, the router and the MTP wiring;
  at 700 and 8300 positions of context (attention by position blocks, folded): the logits against
  the reference, greedy MTP equal to greedy AR on 1 and 2 threads, decoding after the prefill.
Quantized models run at --act-bits 16 (the reference multiplies exact float inputs).

  NEXTN=build/nextn prove -v tests/e2e/parity_mla.t
"""
import json
import os
import shutil
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from paritylib import Parity, ids, inspect  # noqa: E402
from tap import Tap, nextn, scratch  # noqa: E402

t = Tap()
tmp = scratch(prefix="nextn-parity-mla-")
P = Parity(t, tmp, "tools/ref/mla.py", "tests/ref/make_random_mla.py", drafts=("1", "2", "3", "auto"))
FAMILIES = ("glm4_moe_lite", "deepseek_v3")
WIDE = ["--hidden", "256", "--expert-dim", "128", "--inter", "256", "--q-lora-rank", "64"]
GROUPS = ["--experts", "16", "--n-group", "4", "--topk-group", "2", "--topk", "4"]


def cases(fam, seed):
    """(name, generator arguments) for one family; seeds differ per family."""
    f = ["--family", fam]
    return [
        ("hf-odd", [*f, "--layout", "hf", "--seed", str(seed)]),
        ("hf-qnull-groups-own-shards", [*f, "--layout", "hf", "--q-lora-rank", "0", *GROUPS, "--mtp-head", "own",
                                        "--shards", "3", "--seed", str(seed + 1)]),
        ("hf-yarn-groups", [*f, "--layout", "hf", "--yarn", "40", "--mscale", "1.0", "--mscale-all-dim",
                            "1.0" if fam == "deepseek_v3" else "0.7", *GROUPS, "--seed", str(seed + 2)]),
        ("mlx-odd-sidecar", [*f, "--layout", "mlx", "--mtp", "sidecar", "--seed", str(seed)]),
        ("mlx-q4-g64-wide-own", [*f, "--layout", "mlx", "--mtp", "sidecar", "--mtp-head", "own", "--quant", "4:64",
                                 *WIDE, "--seed", str(seed + 3)]),
        ("mlx-q2-g32-inline", [*f, "--layout", "mlx", "--mtp", "inline", "--quant", "2:32", "--seed", str(seed + 4)]),
        ("mlx-q3-g32-groups-hfhead", [*f, "--layout", "mlx", "--mtp", "sidecar-hf", "--quant", "3:32", *GROUPS,
                                      "--seed", str(seed + 5)]),
        ("mlx-q8-g32-yarn-qnull", [*f, "--layout", "mlx", "--mtp", "sidecar", "--quant", "8:32", "--yarn", "8",
                                   "--q-lora-rank", "0", "--seed", str(seed + 6)]),
    ]


rng = np.random.default_rng(37)
tokens = rng.integers(4, 419, size=19).tolist()
prompt = tokens[:6]

for fi, fam in enumerate(FAMILIES):
    results = {}
    for name, gen_args in cases(fam, 100 + 20 * fi):
        full = f"{fam}-{name}"
        results[name] = P.check_model(full, P.gen(full, gen_args), tokens, prompt)

    # the same weights in the HF layout (per-expert, kv_b_proj, inline head) and the MLX one
    # (switch_mlp, embed_q / unembed_out, sidecar head) give the same bits
    a, b = results["hf-odd"], results["mlx-odd-sidecar"]
    t.ok(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]),
         f"{fam} hf-odd and mlx-odd-sidecar (same weights): trunk and MTP logits bit for bit")

    # what inspect reports is what the configs say; the latent cache holds kv_lora + rope values per
    # token and layer (4 trunk layers + the MTP layer, f32), full keys and values would hold
    # heads x (nope + rope + v)
    dense = 1 if fam == "glm4_moe_lite" else 2
    scaling = 1.8 if fam == "glm4_moe_lite" else 2.5
    P.want_fields(f"{fam}-hf-odd", inspect(os.path.join(tmp, f"{fam}-hf-odd")), {
        "family": fam, "layout": "hf", "mtp": "inline", "attention": "mla", "heads": 5, "q_lora_rank": 48,
        "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 24, "rope": "interleaved",
        "rope_scaling": "none", "kv_bytes_per_token": 5 * (64 + 16) * 4,
        "kv_bytes_per_token_expanded": 5 * 5 * (32 + 16 + 24) * 4, "router": "sigmoid+bias", "n_group": 1,
        "topk_group": 1, "norm_topk_prob": True, "routed_scaling": scaling, "shared_experts": 1,
        "dense_layers": dense, "mtp_concat": "embed,hidden", "mtp_recycle": "pre-norm", "mtp_zero_pos0": True,
        "mtp_embed": "trunk", "mtp_head": "trunk"})
    P.want_fields(f"{fam}-hf-qnull-groups-own-shards", inspect(os.path.join(tmp, f"{fam}-hf-qnull-groups-own-shards")),
                {"family": fam, "attention": "mla", "q_lora_rank": 0, "rope_scaling": "none", "n_group": 4,
                 "topk_group": 2, "mtp_embed": "own", "mtp_head": "own"})
    P.want_fields(f"{fam}-hf-yarn-groups", inspect(os.path.join(tmp, f"{fam}-hf-yarn-groups")),
                {"rope": "interleaved", "rope_scaling": "yarn", "q_lora_rank": 48})
    P.want_fields(f"{fam}-mlx-q4-g64-wide-own", inspect(os.path.join(tmp, f"{fam}-mlx-q4-g64-wide-own")),
                {"family": fam, "layout": "mlx", "mtp": "sidecar", "attention": "mla", "q_lora_rank": 64,
                 "mtp_head": "own"})

    # --mtp-recycle overrides the family's pre-norm feedback: still exact (the trunk verifies)
    d = os.path.join(tmp, f"{fam}-hf-odd")
    ar = P.run_ids(d, ids(prompt), 24, 0, "--quiet")[0]
    out = P.run_ids(d, ids(prompt), 24, 3, "--quiet", "--mtp-recycle", "normed")[0]
    t.ok(out == ar, f"{fam}-hf-odd --mtp-recycle normed: greedy MTP equals greedy AR", f"mtp {out}\nar {ar}")

    # drafts accepted: a head that mostly agrees with its trunk (make_random_mla.py --agree; the
    # reference's teacher-forced head agrees with the trunk on ~80% of rows), so verify keeps
    # drafted rows, the latent caches advance past accepted drafts and the head catches up
    d = P.gen(f"{fam}-agree", ["--family", fam, "--layout", "hf", "--agree", "0.05", "--seed", str(21 + fi)])
    ar = P.greedy_ar(d, ids(prompt), 32)
    ref = P.greedy_reference(d, ids(prompt), 32)
    t.ok(ar == ref, f"{fam}-agree: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
    acc = P.greedy_mtp(f"{fam}-agree", d, ids(prompt), ar, 32)
    t.ok(acc >= 32, f"{fam}-agree: drafts accepted ({acc} over draft 1, 2, 3, auto)")

    # nextn convert: HF bf16 -> MLX 4-bit g32 trunk + sidecar head (written from HF layer N),
    # compared with the reference on the converted files
    src = os.path.join(tmp, f"{fam}-hf-qnull-groups-own-shards")
    conv = os.path.join(tmp, f"{fam}-conv-q4")
    nextn("convert", src, conv, "--bits", 4, "--group-size", 32, "--quiet")
    t.ok(os.path.exists(os.path.join(conv, "model-mtp.safetensors")),
         f"{fam} convert writes the head to model-mtp.safetensors")
    P.want_fields(f"{fam}-conv-q4", inspect(conv), {"family": fam, "attention": "mla", "mtp": "sidecar",
                                                  "mtp_embed": "own", "mtp_head": "own", "n_group": 4,
                                                  "q_lora_rank": 0})
    P.check_model(f"{fam}-convert-q4", conv, tokens, prompt)

    # nextn graft: an MLX-quantized trunk without its head (as mlx-lm writes it) + the HF head
    base = P.gen(f"{fam}-mlx-headless", ["--family", fam, "--layout", "mlx", "--mtp", "none", "--quant", "4:32",
                                       "--seed", str(100 + 20 * fi)])
    t.ok(inspect(base)["mtp"].startswith("none"), f"{fam}-mlx-headless: no MTP head")
    grafted = os.path.join(tmp, f"{fam}-grafted")
    nextn("graft", base, os.path.join(tmp, f"{fam}-hf-odd"), "-o", grafted, "--quiet")
    t.ok(inspect(grafted)["mtp"] == "sidecar", f"{fam} graft adds the HF head as a sidecar")
    P.check_model(f"{fam}-graft-q4+hf-head", grafted, tokens, prompt)

# the head from a partial download (DeepSeek-V3's head sits in its own shards): the same HF weights
# in 3 shards, of which only config.json, the index and the shards holding the MTP layer are present,
# graft the same head bytes as the whole checkpoint
fam = "deepseek_v3"
full = P.gen(f"{fam}-hf-odd-shards", ["--family", fam, "--layout", "hf", "--seed", "120", "--shards", "3"])
part = os.path.join(tmp, f"{fam}-hf-odd-head-only")
os.makedirs(part)
with open(os.path.join(full, "model.safetensors.index.json")) as f:
    wmap = json.load(f)["weight_map"]
with open(os.path.join(full, "config.json")) as f:
    n_layers = json.load(f)["num_hidden_layers"]
need = {fn for k, fn in wmap.items() if k.startswith(f"model.layers.{n_layers}.")}
for fn in ["config.json", "model.safetensors.index.json", *need]:
    shutil.copy(os.path.join(full, fn), part)
t.ok(len(need) < len(set(wmap.values())), "the partial copy leaves shards out", f"{sorted(need)}")
grafted_part = os.path.join(tmp, f"{fam}-grafted-partial")
nextn("graft", os.path.join(tmp, f"{fam}-mlx-headless"), part, "-o", grafted_part, "--quiet")
with open(os.path.join(tmp, f"{fam}-grafted", "model-mtp.safetensors"), "rb") as f1, \
        open(os.path.join(grafted_part, "model-mtp.safetensors"), "rb") as f2:
    same = f1.read() == f2.read()
t.ok(same, f"{fam}: graft from the MTP shards alone writes the same head as from the whole checkpoint")

# long contexts: a row's positions are attended in blocks of 256 (of 512 past 8192 positions, so a
# row has at most 32), each block's partial result folded in order. Teacher-forced logits against
# the reference over 700 positions (3 blocks) and 8300 (17 blocks of 512); greedy MTP equal to greedy
# AR after prompts that long, on 1 and 2 threads (the blocks of a short context are split by head
# between the threads, of a long one by block); decoding after them picking one prefill's top logit
PL = Parity(t, tmp, "tools/ref/mla.py", "tests/ref/make_random_mla.py", drafts=("auto",), threads=(1, 2))
# (the 8300-position model has 2 layers, one dense and one MoE: the reference's attention over
# all positions at once costs most of this test)
for fi, (fam, n, layers) in enumerate((("deepseek_v3", 700, 4), ("glm4_moe_lite", 8300, 2))):
    d = P.gen(f"{fam}-long", ["--family", fam, "--layout", "hf", "--agree", "0.05", "--max-pos", "16384",
                              "--layers", str(layers), "--seed", str(31 + fi)])
    seq = rng.integers(4, 419, size=n).tolist()
    PL.check_logits(f"{fam}-long-{n}", d, seq)
    ar = PL.greedy_ar(d, ids(seq[:-20]), 20)
    PL.decode_matches_prefill(f"{fam}-long", d, seq[:-20], [int(x) for x in ar])
    acc = PL.greedy_mtp(f"{fam}-long", d, ids(seq[:-20]), ar, 20)
    t.ok(acc >= 4, f"{fam}-long: drafts accepted after {n - 20} positions ({acc})")

shutil.rmtree(tmp, ignore_errors=True)
t.done()
