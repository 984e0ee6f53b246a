#!/usr/bin/python3
"""Per-step A/B of a change inside one process: steadier than bench/ab.sh's back-to-back runs on
a host whose bandwidth switches level every few seconds.

    bench/ab_steps.py [--runs N] [--tokens N] [--model DIR]

Write the change in the working tree guarded by a flag, e.g. in src/model/forward.c
    if (nx_exp_flag) { ...old... } else { ...new... }
(other files declare `extern int nx_exp_flag;`). This script copies the tree, adds to the copy's
forward.c the flag's definition and a timer that flips the flag every one-row trunk step and
records each one-row trunk step's attention, feed-forward, head and total time, builds it apart
(build-ab/), and runs `nextn bench --modes ar` RUNS times. Each run prints the ratio of the
medians, flag 1 over flag 0 (above 1: the flag-0 variant is faster), and the median of the
per-pair ratios; the last line is the median over runs. An A/A run (no flag used) shows the
spread: about +-0.6% on the total on the Zen 4 VM measured."""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORWARD = "src/model/forward.c"

TIMER = r'''
#include <stdio.h>
#include <stdlib.h>
int nx_exp_flag;
#define XAB_MAX 100000
static float xab_s[2][4][XAB_MAX];
static long xab_n[2];
static int xab_cmp(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static void xab_dump(void) {
    const long n = xab_n[0] < xab_n[1] ? xab_n[0] : xab_n[1];
    if (n == 0) return;
    static float r[XAB_MAX];
    double med[2][4];
    for (int f = 0; f < 2; f++)
        for (int q = 0; q < 4; q++) {
            memcpy(r, xab_s[f][q], sizeof(float) * (size_t)n);
            qsort(r, (size_t)n, sizeof(float), xab_cmp);
            med[f][q] = r[n / 2];
        }
    for (long i = 0; i < n; i++) r[i] = xab_s[1][3][i] / xab_s[0][3][i];
    qsort(r, (size_t)n, sizeof(float), xab_cmp);
    fprintf(stderr, "XAB steps=%ld total=%.4f attn=%.4f ffn=%.4f head=%.4f paired=%.4f\n", n, med[1][3] / med[0][3],
            med[1][0] / med[0][0], med[1][1] / med[0][1], med[1][2] / med[0][2], r[n / 2]);
}
'''


def patch(src):
    anchor = "/* ---------------------------------------------------------------- attention */"
    start = """    memset(&s->traffic, 0, sizeof s->traffic);
    if (cfg->n_linear)"""
    end = """    for (int i = 0; i < ns; i++)
        if (live[i]->st == NX_OK && live[i]->c->sink.forward)
            live[i]->c->sink.forward(live[i]->c->sink.user, false, seg[i].T, &s->traffic);
}"""
    for piece in (anchor, start, end):
        if piece not in src:
            sys.exit(f"ab_steps: {FORWARD} no longer has the lines this script hooks into:\n{piece}")
    src = src.replace(anchor, TIMER + anchor, 1)
    src = src.replace(start, """    memset(&s->traffic, 0, sizeof s->traffic);
    static long xab_calls;
    if (xab_calls == 0) atexit(xab_dump);
    if (T == 1) nx_exp_flag = (int)(xab_calls++ & 1);
    const double xab_t0 = nx_now_s();
    if (cfg->n_linear)""", 1)
    return src.replace(end, """    for (int i = 0; i < ns; i++)
        if (live[i]->st == NX_OK && live[i]->c->sink.forward)
            live[i]->c->sink.forward(live[i]->c->sink.user, false, seg[i].T, &s->traffic);
    if (T == 1 && xab_n[nx_exp_flag] < XAB_MAX) {
        const int f = nx_exp_flag;
        const long k = xab_n[f]++;
        for (int q = 0; q < 3; q++) xab_s[f][q][k] = (float)(s->traffic.phase_s[q] * 1e6);
        xab_s[f][3][k] = (float)((nx_now_s() - xab_t0) * 1e6);
    }
}""", 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--model", default="/tmp/nextn-bench-big36-q4")
    o = ap.parse_args()
    if not os.path.exists(os.path.join(o.model, "config.json")):
        sys.exit(f"ab_steps: no model at {o.model} (make bench generates it)")
    tree = os.path.join(ROOT, "build-ab", "tree")
    for d in ("src", "include", "tools", "web"):
        shutil.rmtree(os.path.join(tree, d), ignore_errors=True)
        shutil.copytree(os.path.join(ROOT, d), os.path.join(tree, d))
    shutil.copy(os.path.join(ROOT, "Makefile"), tree)
    with open(os.path.join(tree, FORWARD)) as f:
        src = f.read()
    with open(os.path.join(tree, FORWARD), "w") as f:
        f.write(patch(src))
    subprocess.run(["make", "-s", "-j2", "build/nextn"], cwd=tree, check=True)
    ratios = []
    for i in range(o.runs):
        r = subprocess.run([os.path.join(tree, "build", "nextn"), "bench", "-m", o.model, "-n", str(o.tokens),
                            "--modes", "ar", "--repeat", "1"], capture_output=True, text=True, cwd=ROOT)
        m = re.search(r"XAB steps=\d+ total=([\d.]+).*", r.stderr)
        if not m:
            sys.exit(f"ab_steps: run {i + 1} printed no XAB line:\n{r.stderr[-2000:]}")
        print(m.group(0), flush=True)
        ratios.append(float(m.group(1)))
    print(f"median total {statistics.median(ratios):.4f} over {len(ratios)} runs (flag 1 / flag 0)")


if __name__ == "__main__":
    main()
