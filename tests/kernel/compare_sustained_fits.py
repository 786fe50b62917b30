"""Compare profiles on a sustained benchmark's validation (weave-sim validate --timing sustained --out DIR): per profile,
the latency error on the held-out and on the fitted token counts, weave's predicted edge over static:20 against the
measured one, and the SM clock error per (configuration, policy) against each policy's measured clock.
Usage: python tests/kernel/compare_sustained_fits.py BENCH.json HELDOUT_TOKENS NAME=DIR/validate.json ..."""
import json
import math
import statistics as st
import sys

sys.path.insert(0, ".")
from weave_sim.benchfile import policy_clocks  # noqa: E402


def gm(x):
    return math.exp(sum(map(math.log, x)) / len(x))


def main(argv):
    bench, held = json.load(open(argv[0])), {int(t) for t in argv[1].split(",")}
    clocks = {(r["model"], r["tokens_per_gpu"]): policy_clocks(r) for r in bench["results"]}
    print(f"{'profile':16}{'held-out |err| med/worst':>26}{'fitted |err| med/worst':>24}"
          f"{'weave/st20 pred/meas (held-out)':>34}{'clock |log err| held-out':>26}")
    for arg in argv[2:]:
        name, path = arg.split("=", 1)
        cfgs = json.load(open(path))["configs"]
        rows = {True: [], False: []}
        ratio = ([], [])
        clk = []
        for c in cfgs:
            h = c["tokens_per_gpu"] in held
            rows[h] += [abs(e) for e in c["relative_error"].values()]
            if h:
                ratio[0].append(c["predicted_ms"]["static:20"] / c["predicted_ms"]["weave"])
                ratio[1].append(c["measured_ms"]["static:20"] / c["measured_ms"]["weave"])
                meas = clocks[(c["model"], c["tokens_per_gpu"])]
                clk += [abs(math.log(p / m)) for pol, per in c["predicted_mhz"].items()
                        for p, m in zip(per, meas.get(pol, [])) if m]
        f = lambda v: f"{100 * st.median(v):.1f}% / {100 * max(v):.1f}%" if v else "-"  # noqa: E731
        print(f"{name:16}{f(rows[True]):>26}{f(rows[False]):>24}"
              f"{gm(ratio[0]):>22.3f} / {gm(ratio[1]):.3f}{st.mean(clk) if clk else float('nan'):>20.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
