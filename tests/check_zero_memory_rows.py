#!/usr/bin/env python3
"""zero-memory's printed stage-3 rows, end to end: with quantized gradients and error feedback
the residual (Ψ elements in the bf16 communication dtype, 2Ψ bytes) is host memory, so the
device rows leave it out; optimizer offload has a stage-3 split. The formulas themselves are
checked in tests/test_zero_memory_rows.cpp; this checks that the tool prints those numbers.

usage: check_zero_memory_rows.py path/to/zero-memory
"""
import json
import subprocess
import sys

ARGS = ["--model", "gpt-25m", "--gpus", "4", "--quantized-gradients", "8"]


def main() -> int:
    tool = sys.argv[1]
    d = json.loads(subprocess.run([tool, *ARGS, "--json"], check=True, capture_output=True,
                                  text=True, timeout=60).stdout)
    s3 = d["stage3"]
    states = s3["model_states"]
    failures = []

    def check(what, ok):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    check("host_states is the bf16 residual, 2Ψ", s3["host_states"] == 2 * d["num_params"])
    check("device_states + host_states = model_states.total",
          s3["device_states"] + s3["host_states"] == states["total"])
    off = s3["offload_optimizer"]
    check("stage 3 offload split is not empty", off["device"] > 0 and off["host"] > 0)
    check("stage 3 offload host holds the residual", off["host"] > s3["host_states"])
    # The text report's device row prints device_states (GB with two decimals).
    text = subprocess.run([tool, *ARGS], check=True, capture_output=True, text=True,
                          timeout=60).stdout
    row = next(line for line in text.splitlines() if "= model states on the device" in line)
    printed = row.split()[-2]  # stage 3's column: "0.10 GB" -> "0.10"
    check(f"text row stage 3 {printed} GB = device_states {s3['device_states'] / 1e9:.2f} GB",
          printed == f"{s3['device_states'] / 1e9:.2f}")
    host_row = next((line for line in text.splitlines() if "of which in host memory" in line), "")
    check("text row 'of which in host memory' shows the residual at stage 3",
          host_row.split()[-2:-1] == [f"{s3['host_states'] / 1e9:.2f}"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
