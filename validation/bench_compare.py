"""Two benchmark reports side by side: each row's time in B over its time in A.

    python -m validation.bench_compare A/bench.json B/bench.json [--out FILE.md]

For every (op, shape, dtype) row both reports hold, and every backend (numba, cudnn, torch)
timed in both, the ratio B / A of the median time per call; then per backend the median and
the spread (10th-90th percentile) of those ratios. PyTorch's own rows measure the run's noise:
the code under test never touches them. Also the host time per tiny call. Use it to show that
a change left the figures where they were (run both reports in one lease, on one GPU).
"""

import argparse
import json
import sys

import numpy as np

BACKENDS = ("numba", "cudnn", "torch")


def _rows(path):
    with open(path) as f:
        rep = json.load(f)
    return rep, {(r["op"], str(r["shape"]), r["dtype"]): r for r in rep["rows"]}


def compare(a_path, b_path):
    a_rep, a = _rows(a_path)
    b_rep, b = _rows(b_path)
    lines = [f"A: {a_path} ({a_rep['device']})", f"B: {b_path} ({b_rep['device']})", "",
             "| op | shape | dtype | " + " | ".join(f"{k} B/A" for k in BACKENDS) + " |",
             "|---|---|---|" + "---|" * len(BACKENDS)]
    ratios = {k: [] for k in BACKENDS}
    for key in a:
        if key not in b:
            continue
        cells = []
        for k in BACKENDS:
            ta, tb = a[key].get(f"{k}_ms"), b[key].get(f"{k}_ms")
            if ta and tb:
                ratios[k].append(tb / ta)
                cells.append(f"{tb / ta:.3f}")
            else:
                cells.append("")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    lines += ["", "| backend | rows | median B/A | 10th-90th percentile |", "|---|---|---|---|"]
    summary = {}
    for k, v in ratios.items():
        if v:
            p10, p50, p90 = np.percentile(v, [10, 50, 90])
            summary[k] = (len(v), p50, p10, p90)
            lines.append(f"| {k} | {len(v)} | {p50:.3f} | {p10:.3f}-{p90:.3f} |")
    over_a = {(n, be): us for n, be, us in a_rep.get("overhead", [])}
    over_b = {(n, be): us for n, be, us in b_rep.get("overhead", [])}
    both = [k for k in over_a if k in over_b]
    if both:
        lines += ["", "| host µs per call | A | B | B/A |", "|---|---|---|---|"]
        lines += [f"| {n} {be} | {over_a[(n, be)]:.1f} | {over_b[(n, be)]:.1f} | "
                  f"{over_b[(n, be)] / over_a[(n, be)]:.2f} |" for n, be in both]
    return "\n".join(lines), summary


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--out")
    args = p.parse_args(argv)
    text, _ = compare(args.a, args.b)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
