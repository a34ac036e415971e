# Sourced (after lib/check.sh) by the e2e scripts that train, save, resume at another layout and
# compare. They set $train (zero-train), $out (use_scratch), $port (the first torchrun port) and
# the array `common` (the arguments every run shares) before calling:
#   launch NAME PROCESSES ARGS...  zero-train on that many processes (1: no torchrun), its log in
#                                  $out/NAME.log (printed when it fails), its metrics in
#                                  $out/NAME.jsonl
#   compare_losses FULL RESUMED TOLERANCE FIRST LAST
#                                  RESUMED logged exactly steps FIRST..LAST, each loss within
#                                  TOLERANCE relative of FULL's at that step (0: the same digits)
#   same_weights A B TOLERANCE     $out/A.safetensors and $out/B.safetensors hold the same names
#                                  and shapes, every tensor within TOLERANCE of A's largest entry
# Each comparison prints every step or the worst difference, and its tolerance.
launch() {
  local name=$1 n=$2
  shift 2
  if [ "$n" = 1 ]; then
    timeout 300 "$train" "${common[@]}" --set "trainer.metrics_file=$out/$name.jsonl" "$@" \
      > "$out/$name.log" 2>&1
  else
    timeout 300 torchrun --no-python --standalone --nproc-per-node "$n" \
      --master-port $((port++)) "$train" "${common[@]}" \
      --set "trainer.metrics_file=$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
  fi || { cat "$out/$name.log"; return 1; }
}
compare_losses() {
  python3 - "$out" "$@" <<'PY'
import json, sys
out, full, res, tol, first, last = sys.argv[1:7]
tol = float(tol)
a = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/{full}.jsonl")}
b = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/{res}.jsonl")}
want = list(range(int(first), int(last) + 1))
assert sorted(b) == want, (sorted(b), want)
worst = 0.0
for s in want:
    rel = abs(a[s] - b[s]) / abs(a[s])
    worst = max(worst, rel)
    print(f"step {s}: {full} {a[s]:.7f}  {res} {b[s]:.7f}  rel diff {rel:.1e}")
print(f"max rel diff {worst:.1e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}
same_weights() {
  python3 - "$out" "$@" <<'PY'
import sys
from safetensors.torch import load_file
out, one, two, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
a = load_file(f"{out}/{one}.safetensors")
b = load_file(f"{out}/{two}.safetensors")
assert set(a) == set(b), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k].shape != b[k].shape]
assert not bad, bad
worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp_min(1e-12)) for k in a)
print(f"{len(a)} tensors; {two} vs {one}: max rel diff {worst:.1e} (tolerance {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}
