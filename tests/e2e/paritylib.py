"""What the per-family parity tests share: one checkpoint checked against a family's independent
reference forward (tools/ref/*.py) — trunk and teacher-forced MTP logits, the greedy continuation,
decoding after a prefill against one prefill, greedy MTP equal to greedy AR — and the small
helpers around it (random checkpoints, `nextn inspect --json` fields).

A family's parity test names its reference, its generator and its cases; the checks are here, so
every family is held to the same ones."""
import json
import os
import re

import numpy as np

from tap import PY, nextn, run

TOL = 2e-3  # of the logit range; both sides compute in f32 from the same bf16 weights


def ids(tokens):
    return ",".join(map(str, tokens))


class Parity:
    """Checks of checkpoints against `ref` (a tools/ref script), made by `gen` (a tests/ref
    generator) into `tmp`. Greedy MTP is run at every draft of `drafts`; with `threads`, greedy AR
    and MTP at each of those thread counts (the first one's AR is the one compared), else at the
    default thread count. Quantized models run at --act-bits 16 (the reference multiplies exact
    float inputs)."""

    def __init__(self, t, tmp, ref, gen, drafts=("1", "2", "3", "auto"), threads=None):
        self.t, self.tmp, self.ref, self.gen_script = t, tmp, ref, gen
        self.drafts, self.threads = drafts, threads
        self.accepted = 0  # drafts accepted in check_model's greedy MTP runs, summed

    def run_ids(self, mdir, pids, n, draft, *extra):
        r = nextn("run", "-m", mdir, "--prompt-tokens", pids, "-n", n, "--print-ids", "--ignore-eos", "--draft",
                  draft, "--act-bits", 16, *extra)
        return r.stdout.split(), r.stderr

    def greedy_ar(self, mdir, pids, n):
        """Greedy AR ids (at the first thread count when thread counts are given)."""
        return self.run_ids(mdir, pids, n, 0, "--quiet", *(("--threads", self.threads[0]) if self.threads else ()))[0]

    def greedy_mtp(self, name, mdir, pids, ar, n):
        """Greedy MTP at every draft (and AR and MTP at every thread count) equals greedy AR `ar`;
        returns the drafts accepted."""
        acc = 0
        for th in self.threads or (None,):
            thr = ("--threads", th) if th else ()
            at = f", --threads {th}" if th else ""
            if th and th != self.threads[0]:
                out = self.run_ids(mdir, pids, n, 0, "--quiet", *thr)[0]
                self.t.ok(out == ar, f"{name}: greedy AR at --threads {th} equals --threads {self.threads[0]}",
                          f"{out}\n{ar}")
            for k in self.drafts:
                out, err = self.run_ids(mdir, pids, n, k, "--stats", *thr)
                self.t.ok(out == ar, f"{name}: greedy MTP (draft {k}{at}) equals greedy AR", f"mtp {out}\nar {ar}")
                m = re.search(r"drafted (\d+), accepted (\d+)", err)
                acc += int(m.group(2)) if m else 0
        return acc

    def decode_matches_prefill(self, name, mdir, prompt, gen):
        """Every token decoded after the prompt's prefill is, in one prefill over prompt +
        continuation, the top logit at its position up to the parity tolerance (ties may break
        either way)."""
        out = os.path.join(self.tmp, name + "-full.npy")
        nextn("eval", "-m", mdir, "--tokens", ids(prompt + gen), "--logits", out, "--act-bits", 16)
        lg = np.load(out)
        rows = lg[len(prompt) - 1:len(prompt) - 1 + len(gen)]
        picked = rows[np.arange(len(gen)), gen]
        gap = float((rows.max(-1) - picked).max())
        rng = float(lg.max() - lg.min())
        exact = int((rows.argmax(-1) == np.array(gen)).sum())
        self.t.ok(gap <= TOL * rng, f"{name}: decode after prefill picks one prefill's top logit ({exact}/{len(gen)} "
                  f"exact, worst gap {gap:.2e} vs range {rng:.2f})")

    def greedy_reference(self, mdir, pids, n):
        return run([PY, self.ref, "--model", mdir, "--tokens", pids, "--greedy", str(n)]).stdout.split()

    def check_logits(self, name, mdir, tokens):
        """Trunk and teacher-forced MTP logits over `tokens` against the reference's; returns the
        engine's."""
        p = lambda s: os.path.join(self.tmp, name + s)  # noqa: E731
        ref_l, ref_m, eng_l, eng_m = p("-ref.npy"), p("-refm.npy"), p("-eng.npy"), p("-engm.npy")
        run([PY, self.ref, "--model", mdir, "--tokens", ids(tokens), "--logits", ref_l, "--mtp-logits", ref_m])
        nextn("eval", "-m", mdir, "--tokens", ids(tokens), "--logits", eng_l, "--mtp-logits", eng_m,
              "--act-bits", 16)
        self.t.logits_close(f"{name} trunk logits", np.load(eng_l), np.load(ref_l), TOL)
        self.t.logits_close(f"{name} MTP logits", np.load(eng_m), np.load(ref_m), TOL)
        return np.load(eng_l), np.load(eng_m)

    def check_model(self, name, mdir, tokens, greedy_prompt, n=24):
        """All the checks on one checkpoint; returns the engine's trunk and MTP logits."""
        logits = self.check_logits(name, mdir, tokens)
        pids = ids(greedy_prompt)
        ref = self.greedy_reference(mdir, pids, n)
        ar = self.greedy_ar(mdir, pids, n)
        self.t.ok(ar == ref, f"{name}: greedy continuation equals the reference", f"engine {ar}\nreference {ref}")
        self.decode_matches_prefill(name, mdir, list(greedy_prompt), [int(x) for x in ar])
        self.accepted += self.greedy_mtp(name, mdir, pids, ar, n)
        return logits

    def gen(self, name, args):
        """A random checkpoint from the generator, in tmp/name."""
        d = os.path.join(self.tmp, name)
        run([PY, self.gen_script, *args, "--out", d])
        return d

    def want_fields(self, name, info, want):
        got = {k: info.get(k) for k in want}
        self.t.ok(got == want, f"inspect {name}: " + ", ".join(sorted(want)), json.dumps({"got": got, "want": want}))


def inspect(mdir):
    return json.loads(nextn("inspect", "-m", mdir, "--json").stdout)
