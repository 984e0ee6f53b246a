#!/usr/bin/python3
"""The step-time model of a split model (docs/multinode.md) and its projection to real nodes.

A trunk step of T rows (1: plain decoding; k + 1: a verify of k drafts) on R nodes costs

    t(T) = compute(T) + Σ_messages (latency + bytes / bandwidth)    (messages on the critical path)

with the messages and bytes `nextn` sends (src/model/split.c), counted here from the shapes and
checked against the counts measured on localhost ranks (bench/mpi.sh: --check):

  pipeline  the command (1.4 KB broadcast), R - 1 hops of T x H f32 hidden states, the logits of
            the rows rank 0 samples (T x V f32) back from the last node; compute is the whole
            model's (the stages run one after another for one sequence): one node's step time;
  experts   the command, then one all-gather per MoE layer of the T x top_k expert outputs
            (T x k x H f32, each node receiving (R - 1)/R of them, R - 1 rounds of latency: a ring);
            compute is the replicated part (attention, dense layers, shared expert, head) plus the
            routed experts divided by R (every node's memory bandwidth works on every token).

An MTP cycle drafts k tokens (k head forwards on the last node / every node) and verifies them in
one (k + 1)-row step; it emits E = (1 - a^(k+1)) / (1 - a) tokens at acceptance a. Weight bytes per
step come from the published shapes at 4 bits (0.5625 bytes a parameter, g64 with bf16 scales and
biases); compute is those bytes over the node's measured weight-read rate.

Usage: bench/mpi_model.py [--read-gbs 53] [--check MEASURED.json]
"""
import argparse
import json
import math

BPP = 0.5625  # bytes a parameter at 4-bit g64

SHAPES = {
    # Hy3 (docs/design.md §2.1): attention 75.5 M a layer, one expert 18.9 M, 80 layers (1 dense),
    # 192 experts top-8 + 1 shared, hidden 4096, vocab 120832, dense FFN 13312
    "Hy3": dict(H=4096, V=120832, layers=80, moe_layers=79, k=8, E=192, attn=75.5e6, expert=18.9e6,
                shared=18.9e6, dense=3 * 4096 * 13312, mtp_layer=3.75e9, mtp_active=75.5e6 + 9 * 18.9e6),
    # DeepSeek-V3: hidden 7168, 61 layers (3 dense), 256 experts of 2048 top-8 + 1 shared, MLA
    # attention ~187 M a layer, dense FFN 18432, vocab 129280
    "DeepSeek-V3": dict(H=7168, V=129280, layers=61, moe_layers=58, k=8, E=256, attn=187e6,
                        expert=3 * 7168 * 2048, shared=3 * 7168 * 2048, dense=3 * 7168 * 18432,
                        mtp_layer=11.7e9, mtp_active=187e6 + 9 * 3 * 7168 * 2048),
}
# Ethernet with MPI over TCP: one-way small-message latency and usable bandwidth
NETS = {"10GbE": (30e-6, 1.15e9), "25GbE": (20e-6, 2.9e9), "100GbE": (10e-6, 11.0e9)}
CMD = 1416  # bytes of rank 0's command message (split_msg)


def union_factor(T):
    """Distinct experts of a T-row verify over one row's: consecutive tokens share about a quarter
    of their top-k (docs/design.md §8), so each extra row adds ~3/4 of a step's experts."""
    return 1 + 0.75 * (T - 1)


def step(s, split, R, T, net, read):
    """Seconds of a T-row trunk step on R nodes, and (bytes, messages) rank 0 waits for."""
    lat, bw = net
    H, V, k = s["H"], s["V"], s["k"]
    routed = s["moe_layers"] * k * s["expert"] * union_factor(T)
    rest = (s["layers"] * s["attn"] + s["moe_layers"] * s["shared"] + (s["layers"] - s["moe_layers"]) * s["dense"]
            + H * V)  # attention, shared experts, dense layers, lm_head
    msgs, byts = 0, 0.0
    if R > 1:
        msgs += math.ceil(math.log2(R))  # command broadcast (tree)
        byts += CMD
    if split == "pipeline":
        compute = (routed + rest) * BPP / read
        if R > 1:
            msgs += (R - 1) + 1
            byts += (R - 1) * T * H * 4 + T * V * 4
    else:
        compute = (routed / R + rest) * BPP / read
        if R > 1:
            msgs += s["moe_layers"] * (R - 1)
            byts += s["moe_layers"] * T * k * H * 4 * (R - 1) / R
    return compute + msgs * lat + byts / bw, byts, msgs


def mtp_row(s, split, R, net, read):
    """Seconds of one draft (the MTP head: its layer's active weights and lm_head)."""
    lat, bw = net
    t = (s["mtp_active"] + s["H"] * s["V"]) * BPP / read
    if R > 1:
        t += 2 * lat + (CMD + s["V"] * 4) / bw if split == "pipeline" else \
            R * lat + s["k"] * s["H"] * 4 / bw
    return t


def project(read, acc, kmax=3):
    rows = []
    for name, s in SHAPES.items():
        for split in ("pipeline", "experts"):
            for net_name, net in NETS.items():
                for R in (2, 4, 8):
                    t1, b1, m1 = step(s, split, R, 1, net, read)
                    best = (0, 1.0 / t1)
                    for k in range(1, kmax + 1):
                        tv, _, _ = step(s, split, R, k + 1, net, read)
                        E = (1 - acc ** (k + 1)) / (1 - acc)
                        rate = E / (tv + k * mtp_row(s, split, R, net, read))
                        best = max(best, (k, rate), key=lambda x: x[1])
                    rows.append((name, split, net_name, R, 1.0 / t1, b1, m1, best[0], best[1]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--read-gbs", type=float, default=53.0,
                    help="a node's weight-read rate in GB/s (docs/performance.md: Hy3-shaped 4-bit model)")
    ap.add_argument("--acceptance", type=float, default=0.844, help="per-draft acceptance (Hy3's head, k=1)")
    ap.add_argument("--local", nargs=4, type=int, metavar=("H", "V", "MOE_LAYERS", "TOPK"),
                    help="also print the job-wide messages and bytes of a plain step for these shapes")
    a = ap.parse_args()
    read = a.read_gbs * 1e9
    if a.local:
        H, V, L, k = a.local
        print("# counted for H %d, V %d, %d MoE layers, top-%d (job-wide, plain step)" % (H, V, L, k))
        for split in ("pipeline", "experts"):
            for R in (2, 3):
                msgs, byts = job_counts(H, V, L, k, split, R)
                print(f"{split:8s} {R} ranks: {msgs} messages, {byts / 1e3:.2f} KB")
    print(f"# step model: {a.read_gbs} GB/s weight reads per node, acceptance {a.acceptance}, 4-bit weights")
    print("# model split net nodes | AR tok/s, KB and messages per step | best k, MTP tok/s (x AR)")
    for name, split, net, R, ar, b1, m1, k, mtp in project(read, a.acceptance):
        print(f"{name:12s} {split:8s} {net:6s} {R} | AR {ar:6.2f} tok/s {b1 / 1e3:8.1f} KB {m1:4d} msgs | "
              f"k={k} {mtp:6.2f} tok/s ({mtp / ar:.2f}x)")


def job_counts(H, V, L, k, split, R):
    """Messages and bytes every rank together sends in a plain step, as src/dist/dist.c counts them
    (a broadcast: R - 1 messages; an all-gather: each rank's block to the R - 1 others)."""
    if split == "pipeline":
        return (R - 1) + (R - 1) + 1, CMD * (R - 1) + (R - 1) * H * 4 + V * 4
    return (R - 1) + L * R * (R - 1), CMD * (R - 1) + L * (R - 1) * k * H * 4


if __name__ == "__main__":
    main()
