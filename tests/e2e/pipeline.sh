#!/usr/bin/env bash
# Pipeline parallelism with ZeRO-1 on each stage, real processes through torchrun (gloo): the
# tiny preset as P = 2 stages on 2 processes (pp 2 x dp 1) and on 4 (pp 2 x dp 2), 1F1B and GPipe,
# against P = 1 (one process, the plain trainer), the same global batch of 8 sequences (the
# sampler gives every layout the same samples per step), the same initial weights (every rank
# builds the full model from the seed and keeps its stage's layers): the loss of every step must
# agree within 1e-5 relative. With clipping (0.05 clips every step: the tiny preset's norm is ~1)
# the reported norm is the whole model's (summed over the stages). A layout that does not fit
# (3 stages on 4 ranks) and ZeRO-2 stop with the key named. P = 2 x T = 2 (pipeline x tensor
# parallelism) trains as P = 1 does, and so does the interleaved schedule (P = 2, v = 2); the
# summary and the monitors report with P > 1. A run resumed from a per-stage checkpoint
# continues with the uninterrupted run's losses.
#
# The tolerance: the same fp32 arithmetic in another order (micro-batches accumulated per stage,
# the dp all-reduce over 2 instead of none); the metrics file keeps 7 significant digits. A
# wrong stage boundary, a lost micro-batch or a gradient not sent back moves the loss by 1e-3 or
# more within two steps.
set -euo pipefail
train=$1
src=$2
source "$src/tests/e2e/lib/check.sh"
use_scratch
port=$(free_port 35500)
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.steps=6
        --set trainer.seq_len=32 --set train_batch_size=8 --set train_micro_batch_size_per_gpu=2
        --set steps_per_print=1 --set zero_optimization.stage=1 --set gradient_clipping=0
        --set scheduler.params.total_num_steps=6 --set scheduler.params.warmup_num_steps=2)
run() {
  local name=$1 n=$2
  shift 2
  torchrun --no-python --standalone --nproc-per-node "$n" --master-port $((port++)) "$train" \
    "${common[@]}" --set "trainer.metrics_file=$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1
}
check "P = 1 trains" run p1 1 --set gradient_accumulation_steps=4 --summary-json "$out/p1.json"
check "P = 2 (2 processes) trains, 1f1b" run p2 2 --set gradient_accumulation_steps=4 \
  --set pipeline.stages=2 --summary-json "$out/p2.json"
# Rank 0's outputs unwritable with P = 2: both processes stop before training (rank 1 too, not
# at its first send after comm_timeout_s), the cause named.
unwritable() {
  mkdir -p "$out/afile" && : > "$out/afile/file"
  local rc=0
  timeout 120 torchrun --no-python --standalone --nproc-per-node 2 --master-port $((port++)) \
    "$train" "${common[@]}" --set pipeline.stages=2 --set gradient_accumulation_steps=4 \
    --summary-json "$out/afile/file/s.json" \
    > "$out/unwritable.log" 2>&1 || rc=$?
  echo "    exit $rc"
  test $rc -ne 0 -a $rc -ne 124 &&
    test "$(grep -c '^step' "$out/unwritable.log")" -eq 0 &&
    grep -q "rank 0: error: .*--summary-json: cannot write" "$out/unwritable.log" &&
    grep -q "rank 1: error: .*another rank refused its start-up checks" "$out/unwritable.log"
}
check "P = 2: an unwritable --summary-json stops every rank before training" unwritable
check "P = 2 x D = 2 (4 processes) trains, 1f1b" run p2d2 4 --set gradient_accumulation_steps=2 \
  --set pipeline.stages=2
check "P = 2 x D = 2 trains, gpipe" run p2d2g 4 --set gradient_accumulation_steps=2 \
  --set pipeline.stages=2 --set pipeline.schedule=gpipe
check "the start-up line shows the grid" \
  grep -q "zero-train: tiny ([0-9]* parameters), 4 ranks (pp 2 x dp 2 x tp 1) on cpu" "$out/p2d2.log"
check "the stages' layers are shown" grep -q "pipeline: stage 1 holds layers" "$out/p2d2.log"
compare() {
  python3 - "$out" "$@" <<'PY'
import json, sys
out, one, two = sys.argv[1:4]
key = sys.argv[4] if len(sys.argv) > 4 else "loss"
a = [json.loads(l)[key] for l in open(f"{out}/{one}.jsonl")]
b = [json.loads(l)[key] for l in open(f"{out}/{two}.jsonl")]
assert len(a) == len(b) == 6, (len(a), len(b))
worst = 0.0
for step, (x, y) in enumerate(zip(a, b), 1):
    rel = abs(x - y) / abs(x)
    worst = max(worst, rel)
    print(f"step {step}: {one} {x:.7f}  {two} {y:.7f}  rel diff {rel:.1e}")
print(f"{key}: worst rel diff {worst:.1e} (tolerance 1e-5)")
sys.exit(0 if worst < 1e-5 and (key != "loss" or a[-1] < a[0]) else 1)
PY
}
check "P = 2 losses equal P = 1's" compare p1 p2
check "P = 2 x D = 2 losses equal P = 1's" compare p1 p2d2
check "gpipe losses equal 1f1b's" compare p2d2 p2d2g
# Megatron's interleaved 1F1B: each of the 2 stages holds 2 model chunks (the tiny preset's 4
# layers, one per chunk; stage 1's chunk 0 feeds stage 0's chunk 1), P = 1's losses.
check "P = 2 interleaved (v = 2, 2 processes) trains" run p2i 2 \
  --set gradient_accumulation_steps=4 --set pipeline.stages=2 \
  --set pipeline.schedule=interleaved --set pipeline.virtual_stages=2
check "interleaved: each stage's chunks are shown" \
  grep -q "pipeline: stage 1 chunk 1 (virtual stage 3) holds layers 3..3" "$out/p2i.log"
check "interleaved losses equal P = 1's" compare p1 p2i

check "P = 1 trains with clipping" run p1clip 1 --set gradient_accumulation_steps=4 \
  --set gradient_clipping=0.05
check "P = 2 x D = 2 trains with clipping" run p2d2clip 4 --set gradient_accumulation_steps=2 \
  --set pipeline.stages=2 --set gradient_clipping=0.05
check "with clipping, P = 2 x D = 2 losses equal P = 1's" compare p1clip p2d2clip
check "the reported gradient norm is the whole model's" compare p1clip p2d2clip grad_norm

# Pipeline x tensor parallelism (3D): P = 2 x T = 2 on 4 processes, each stage's layers the
# tensor-parallel GPT's (vocabulary-parallel embedding and cross-entropy), activations sent
# between the same tensor-parallel rank of consecutive stages, the norm summed over tp (the
# replicated RMSNorms once) and pp: P = 1's losses and, with clipping, its norm. The summary and
# the csv monitor with P > 1: the summary's per-stage report and the whole model's parameter
# norm (summed over the stages: P = 2's equals P = 1's), the monitor's losses the metrics file's.
check "P = 2 x T = 2 (4 processes) trains" run p2t2 4 --set gradient_accumulation_steps=4 \
  --set pipeline.stages=2 --set tensor_parallel.autotp_size=2 --summary-json "$out/p2t2.json" \
  --set csv_monitor.enabled=true --set "csv_monitor.output_path=$out/monitor" \
  --set csv_monitor.job_name=p2t2
check "the start-up line shows pp 2 x dp 1 x tp 2" \
  grep -q "4 ranks (pp 2 x dp 1 x tp 2) on cpu" "$out/p2t2.log"
check "P = 2 x T = 2 losses equal P = 1's" compare p1 p2t2
check "P = 2 x T = 2 trains with clipping" run p2t2clip 4 --set gradient_accumulation_steps=4 \
  --set pipeline.stages=2 --set tensor_parallel.autotp_size=2 --set gradient_clipping=0.05
check "with clipping, P = 2 x T = 2 losses equal P = 1's" compare p1clip p2t2clip
check "P = 2 x T = 2's gradient norm is the whole model's" compare p1clip p2t2clip grad_norm
check "the progress line splits the step, every stage's after it" \
  grep -q "stages: 0 fwd [0-9]*% bwd [0-9]*% opt [0-9]*% comm [0-9]*% mem .* | 1 fwd" \
  "$out/p2t2.log"
pipeline_reports() {
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/p2t2.json"))
losses = [json.loads(l)["loss"] for l in open(f"{out}/p2t2.jsonl")]
assert s["grid"] == "pp 2 x dp 1 x tp 2" and s["steps"] == 6, s
assert abs(s["final_loss"] - losses[-1]) <= 1e-6 * losses[-1], (s["final_loss"], losses[-1])
assert [st["stage"] for st in s["stages"]] == [0, 1], s["stages"]
for st in s["stages"]:
    print("stage", st)
    assert st["forward_s_mean"] > 0 and st["backward_s_mean"] > 0, st
    assert st["model_states_bytes"] > 0 and st["peak_rss_bytes"] > 0, st
assert s["forward_s_mean"] < s["step_seconds_median"], s  # no longer the whole step
csv = open(f"{out}/monitor/p2t2/Train_Samples_train_loss.csv").read().split()
rows = [float(r.split(",")[1]) for r in csv[1:]]
assert len(rows) == 6 and all(abs(a - b) <= 1e-6 * b for a, b in zip(rows, losses)), rows
one, two = json.load(open(f"{out}/p1.json")), json.load(open(f"{out}/p2.json"))
rel = abs(one["param_norm"] - two["param_norm"]) / one["param_norm"]
print("parameter norm P = 1", one["param_norm"], "P = 2", two["param_norm"], "rel diff", rel)
assert rel < 1e-5
# P = 2 x T = 2's is the whole model's too (the tensor-parallel shards summed, the replicated
# norms once), not tensor-parallel rank 0's shards.
rel = abs(one["param_norm"] - s["param_norm"]) / one["param_norm"]
print("parameter norm P = 1", one["param_norm"], "P = 2 x T = 2", s["param_norm"], "rel diff", rel)
assert rel < 1e-4
# One schema: the pipeline's summary has every memory key of the plain one, measured.
memory = ["peak_rss_bytes", "peak_rss_bytes_per_rank", "device_peak_allocated_bytes",
          "device_peak_allocated_bytes_per_rank", "startup_peak_rss_bytes",
          "rss_after_initialize_bytes", "phase_peaks", "phase_step_peaks", "steady_states_bytes",
          "phase_bound_bytes"]
missing = [(k, f) for k in memory for f, d in (("p1", one), ("p2", two)) if k not in d]
assert not missing, missing
assert set(two["phase_peaks"]) == set(one["phase_peaks"]), (two["phase_peaks"], one["phase_peaks"])
assert len(two["peak_rss_bytes_per_rank"]) == 2 and min(two["peak_rss_bytes_per_rank"]) > 0, two
assert len(s["peak_rss_bytes_per_rank"]) == 4, s
assert len(two["phase_step_peaks"]) == two["steps"] and min(two["phase_step_peaks"]) > 0, two
assert two["phase_peaks"]["initialize"]["measured"] > 0, two["phase_peaks"]
assert two["startup_peak_rss_bytes"] > 0 and two["steady_states_bytes"] > 0, two
PY
}
check "the summary reports each stage, the monitor the losses" pipeline_reports

# Checkpoints per stage: P = 2 x D = 2 saves every 2 steps (each stage's engine in
# save_dir/stage<s>/); a run resumed from step 2 continues with the very losses of the
# uninterrupted one (the tied head's copy on the last stage gets the loaded embedding).
ckpt_run() {
  local name=$1
  shift
  run "$name" 4 --set gradient_accumulation_steps=2 --set pipeline.stages=2 --set trainer.steps=4 \
    --set scheduler.params.total_num_steps=4 --set "trainer.save_dir=$out/ckpt" "$@"
}
check "P = 2 x D = 2 saves every 2 steps" ckpt_run full --set trainer.save_interval=2
check "each stage wrote its shards" test -f "$out/ckpt/stage0/step2/manifest.json" -a \
  -f "$out/ckpt/stage1/step2/manifest.json"
check "P = 2 x D = 2 resumes from step 2" ckpt_run resumed --set trainer.resume=step2
resumed_equal() {
  python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
full = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/full.jsonl")}
res = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{out}/resumed.jsonl")}
print("uninterrupted", full, "resumed", res)
sys.exit(0 if sorted(res) == [3, 4] and all(res[s] == full[s] for s in res) else 1)
PY
}
check "the resumed losses equal the uninterrupted run's" resumed_equal

bad() {
  local pattern=$1
  shift
  ! run bad 4 "$@" --set trainer.steps=1 && grep -q "$pattern" "$out/bad.log"
}
check "3 stages on 4 ranks: the error names the numbers" \
  bad "pipeline.stages = 3 does not divide the world size 4" --set pipeline.stages=3 \
  --set gradient_accumulation_steps=1 --set train_batch_size=auto
check "ZeRO-2 with stages: refused naming the key" \
  bad "zero_optimization.stage' 2 with pipeline.stages 2" --set pipeline.stages=2 \
  --set zero_optimization.stage=2 --set gradient_accumulation_steps=2
check "2 stages x tp 3 on 4 ranks: the error names the numbers" \
  bad "pipeline.stages = 2 x tensor_parallel.autotp_size = 3 does not divide the world size 4" \
  --set pipeline.stages=2 --set tensor_parallel.autotp_size=3 --set gradient_accumulation_steps=1 \
  --set train_batch_size=auto
summary
