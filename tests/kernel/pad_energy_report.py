"""Padding's energy from one device call of tests/kernel/pad_energy_run.sh (CPU): power.pad_energy as
`weave-sim calibrate` reads it off the calibration's zero-row runs, and the same ratio for tile_limits' sustained
modes (bf16 mode 7, FP8 modes 14 and 17) at each TL_ZERO_ROWS, each against the same mode and shape without zero
rows, under the calibration's own power fit (base_w, w_per_tflops, exponent).

    python tests/kernel/pad_energy_report.py CALIB.json tile_*zero*.log
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from weave_sim.calibrate import pad_energy, power_model

SHAPE = re.compile(r"K=(\d+), (\d+) experts x (\d+) rows")
ZERO = re.compile(r"^A: the last (\d+) rows of every (\d+)-row block are zeros")
SUSTAINED = re.compile(r"^(\d+) .*?\s([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+([\d.]+)(?:\s+([\d.]+))?$")


def read_tile_log(path: Path) -> dict:
    """{shape, zero_rows, block, modes: {mode: {tflops, sm_mhz, power_w}}} of one tile_limits log."""
    shape, zero, block, modes, sustained = None, 0, 128, {}, False
    for line in path.read_text().splitlines():
        if (m := ZERO.match(line)):
            zero, block = int(m.group(1)), int(m.group(2))
        elif (m := SHAPE.search(line)) and shape is None:
            shape = tuple(int(g) for g in m.groups())
        elif line.startswith("sustained,"):
            sustained = True
        elif sustained and (m := SUSTAINED.match(line)):
            modes[int(m.group(1))] = {"tflops": float(m.group(2)), "sm_mhz": float(m.group(4)),
                                      "power_w": float(m.group(5))}
    if shape is None or not modes:
        raise SystemExit(f"{path}: no shape line or no sustained results (a tile_limits run with TL_SUSTAIN?)")
    return {"shape": shape, "zero_rows": zero, "block": block, "modes": modes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("calib", type=Path, help="python -m weave_kernel.calibrate output with a power block")
    ap.add_argument("tile_logs", type=Path, nargs="*", help="tile_limits logs (TL_SUSTAIN, TL_ZERO_ROWS)")
    args = ap.parse_args(argv)
    power = json.loads(args.calib.read_text())["power"]
    fit = power_model(power)
    print(f"calibration power fit: base {fit['base_w']} W, {fit['w_per_tflops']} W per TFLOP/s, exponent "
          f"{fit['exponent']}, clock {fit['clock_mhz']:.0f} MHz")
    if "pad_energy" in fit:
        for p, e in zip(power["pad_points"], fit["pad_energy_points"]):
            print(f"calibration GEMM (bf16, the megakernel's tile and epilogue), {p['pad_rows']} of 128 rows zero: "
                  f"{p['tflops']:.0f} TF/s at {p['sm_mhz']:.0f} MHz, {p['power_w']:.0f} W -> pad_energy {e:.3f}")
        print(f"pad_energy (median): {fit['pad_energy']}")
    logs = [read_tile_log(p) for p in args.tile_logs]
    refs = {lg["shape"]: lg for lg in logs if lg["zero_rows"] == 0}
    kw = dict(base=fit["base_w"], w=fit["w_per_tflops"], exponent=fit["exponent"], f_max=fit["clock_mhz"])
    rows = []
    for lg in logs:
        ref = refs.get(lg["shape"])
        if lg["zero_rows"] == 0 or ref is None:
            continue
        for mode, pt in sorted(lg["modes"].items()):
            if mode not in ref["modes"]:
                continue
            e = pad_energy([{**pt, "ctas": 132, "pad_fraction": lg["zero_rows"] / lg["block"]}],
                           [{**ref["modes"][mode], "ctas": 132}], **kw)["pad_energy_points"][0]
            rows.append((lg["shape"], mode, lg["zero_rows"], ref["modes"][mode], pt, e))
    if rows:
        print(f"\n{'K, experts x rows':>20} {'mode':>4} {'zero rows':>9} {'random: TF/s MHz W':>22} "
              f"{'zero rows: TF/s MHz W':>24} {'pad_energy':>10}")
        for shape, mode, z, r, p, e in rows:
            print(f"{f'{shape[0]}, {shape[1]} x {shape[2]}':>20} {mode:>4} {z:>9} "
                  f"{r['tflops']:>8.0f} {r['sm_mhz']:>6.0f} {r['power_w']:>6.0f} "
                  f"{p['tflops']:>10.0f} {p['sm_mhz']:>6.0f} {p['power_w']:>6.0f} {e:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
