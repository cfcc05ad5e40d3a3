#!/usr/bin/env python3
"""Compares a `trellis run --dump-logits` dump and its printed greedy ids with llama.cpp's
reference outputs (tests/data/reference, see tests/data/README.md).

usage: check_reference.py MODEL.pN.json MODEL.pN.all_logits.f32 tolerances.json MODEL_NAME
                          OUR_LOGITS.f32 OUR_IDS.txt [MODEL.pN.decode_logits.f32]
With the decode reference (a run with --force-tokens = `greedy`), the dump holds the
prompt rows and then one row per forced token; those are checked the same way (rms/std
bound, argmax where the reference margin is decisive).
Checks: dump size = n_prompt * n_vocab * 4; every row's rms(ours - ref) / std(ref) is
below the model's bound; the greedy ids equal `greedy` up to the first divergence, and a
divergence is allowed only where the deciding reference margin (last prompt row's top-1
minus top-2 for token 0, then greedy_top2_margins[k-1]) is <= the argmax threshold.
Python standard library only. Exit 1 on failure.
"""
import array
import json
import math
import os
import sys


def read_f32(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def top2_margin(row):
    best = second = -math.inf
    for x in row:
        if x > best:
            best, second = x, best
        elif x > second:
            second = x
    return best - second


def rel_rms(o, f):
    """rms(o - f) / std(f); inf for a non-finite value (NaN never passes a < check)."""
    n = len(f)
    if not all(math.isfinite(x) for x in o) or not all(math.isfinite(x) for x in f):
        return math.inf
    mean = sum(f) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in f) / n)
    rms = math.sqrt(sum((a - b) ** 2 for a, b in zip(o, f)) / n)
    return rms / std if std > 0 else math.inf


def argmax(row):
    return max(range(len(row)), key=lambda i: (row[i], -i))


def main(ref_json, ref_logits, tol_json, name, our_logits, our_ids, ref_decode=None):
    ref = json.load(open(ref_json))
    rms_bound, margin_bound = json.load(open(tol_json))[name]
    prompt, greedy, margins = ref["prompt"], ref["greedy"], ref["greedy_top2_margins"]
    n_prompt = len(prompt)
    ref_l = read_f32(ref_logits)
    n_vocab = len(ref_l) // n_prompt
    assert n_vocab * n_prompt == len(ref_l), "reference logits size is not a multiple of n_prompt"
    ok = True

    dec_l = read_f32(ref_decode) if ref_decode else array.array("f")
    n_dec = len(dec_l) // n_vocab
    size = os.path.getsize(our_logits)
    if size != (n_prompt + n_dec) * n_vocab * 4:
        print(f"  FAIL dump size {size} != (n_prompt+n_decode)*n_vocab*4 = ({n_prompt}+{n_dec})*{n_vocab}*4")
        return 1
    print(f"  ok   dump size {size} = ({n_prompt} + {n_dec}) x {n_vocab} x 4")
    ours = read_f32(our_logits)

    if n_dec:
        worst_dec = 0.0
        for r in range(n_dec):
            o = ours[(n_prompt + r) * n_vocab:(n_prompt + r + 1) * n_vocab]
            f = dec_l[r * n_vocab:(r + 1) * n_vocab]
            rel = rel_rms(o, f)
            if not rel <= worst_dec:
                worst_dec = rel
            if not rel < rms_bound:
                ok = False
                print(f"  FAIL decode step {r}: rms/std {rel:.4g} >= {rms_bound}")
            if top2_margin(f) > margin_bound and argmax(o) != argmax(f):
                ok = False
                print(f"  FAIL decode step {r}: argmax {argmax(o)} != llama.cpp's {argmax(f)} (margin {top2_margin(f):.3f})")
        print(f"  {'ok  ' if ok else 'FAIL'} decode: worst rms/std {worst_dec:.4g} over {n_dec} forced steps vs bound {rms_bound}")

    worst, worst_row = 0.0, -1
    for r in range(n_prompt):
        o, f = ours[r * n_vocab:(r + 1) * n_vocab], ref_l[r * n_vocab:(r + 1) * n_vocab]
        mean = sum(f) / n_vocab
        std = math.sqrt(sum((x - mean) ** 2 for x in f) / n_vocab)
        rms = math.sqrt(sum((a - b) ** 2 for a, b in zip(o, f)) / n_vocab)
        rel = rms / std if std > 0 else math.inf
        if not rel < rms_bound:  # also catches NaN
            ok = False
            if worst_row < 0 or r < 3:
                print(f"  FAIL row {r}: rms/std {rel:.4g} >= {rms_bound}")
        if not rel <= worst:
            worst, worst_row = rel, r
    print(f"  {'ok  ' if ok else 'FAIL'} logits: worst rms/std {worst:.4g} (row {worst_row}) vs bound {rms_bound} over {n_prompt} rows")

    ids = [int(x) for x in open(our_ids).read().split()]
    if len(ids) != len(greedy):
        print(f"  FAIL printed {len(ids)} ids, expected {len(greedy)}")
        return 1
    deciding = [top2_margin(ref_l[(n_prompt - 1) * n_vocab:])] + list(margins)
    matched = 0
    for k, (a, b) in enumerate(zip(ids, greedy)):
        if a == b:
            matched += 1
            continue
        if deciding[k] <= margin_bound:
            print(f"  ok   greedy: {matched} ids match, then step {k} diverges ({a} vs {b}) "
                  f"on a close call (ref margin {deciding[k]:.3f} <= {margin_bound})")
        else:
            ok = False
            print(f"  FAIL greedy step {k}: got {a}, llama.cpp {b}, and the ref margin {deciding[k]:.3f} > {margin_bound}")
        break
    else:
        print(f"  ok   greedy: all {matched} ids match llama.cpp")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
