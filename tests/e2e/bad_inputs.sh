#!/usr/bin/env bash
# Inputs that used to be accepted silently, or to hang or grow without bound, are refused at
# start (before any training step) with an error naming the key or the file; each run is bounded
# by `timeout`. Single-rank runs, except where the check is about ranks agreeing.
set -uo pipefail
train=$1
src=$2
consolidate=$(dirname "$train")/../tools/zero-consolidate
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
common=(--config "$src/configs/zero2.yaml" --set trainer.model=tiny --set trainer.seq_len=32
        --set train_micro_batch_size_per_gpu=2 --set steps_per_print=1)

# refused NAME PATTERN ARGS...: zero-train ARGS exits non-zero within 60 s, trains no step, and
# its error line matches PATTERN.
refused() {
  local name=$1 pattern=$2
  shift 2
  timeout 60 "$train" "$@" > "$out/$name.out" 2> "$out/$name.err"
  local rc=$?
  check "$name: refused (exit $rc)" test $rc -ne 0 -a $rc -ne 124
  check "$name: before any training step" test "$(grep -c '^step' "$out/$name.out")" -eq 0
  check "$name: the error names it" grep -Eq "zero-train: error: .*$pattern" "$out/$name.err"
  grep -m1 "error" "$out/$name.err" | cut -c1-300 | sed 's/^/    /'
}
# trains NAME ARGS...: zero-train ARGS succeeds within 120 s.
trains() {
  local name=$1
  shift
  timeout 120 "$train" "${common[@]}" "$@" > "$out/$name.out" 2> "$out/$name.err"
  local rc=$?
  check "$name: trains (exit $rc)" test $rc -eq 0
  [ $rc -eq 0 ] || tail -3 "$out/$name.err"
}

# Numeric trainer keys out of range, and stray arguments.
refused steps "trainer.steps = -1 is out of range" "${common[@]}" --set trainer.steps=-1
refused interval "trainer.save_interval = -5 is out of range" "${common[@]}" \
  --set trainer.save_interval=-5 --set trainer.save_dir="$out/c"
refused keep "trainer.keep_last = -1 is out of range" "${common[@]}" --set trainer.keep_last=-1
refused seq "trainer.seq_len = 0 is out of range" "${common[@]}" --set trainer.seq_len=0
refused positional "unexpected argument 'stray'" "${common[@]}" stray

# Config files that are not regular files.
mkfifo "$out/fifo.yaml"
refused config_zero "--config: '/dev/zero' is a character device" --config /dev/zero
refused config_fifo "--config: '$out/fifo.yaml' is a FIFO" --config "$out/fifo.yaml"

# Data files: a directory, a FIFO, llm.c headers of another version or a negative count.
mkdir "$out/textdir"
mkfifo "$out/data.fifo"
refused text_dir "trainer.data 'text:$out/textdir': '$out/textdir' is a directory" \
  "${common[@]}" --set trainer.data="text:$out/textdir"
refused bin_fifo "trainer.data 'bin:$out/data.fifo': '$out/data.fifo' is a FIFO" \
  "${common[@]}" --set trainer.data="bin:$out/data.fifo"
# llm.c token file: 256 int32 header (magic, version, count), then the tokens.
llmc() {  # llmc PATH MAGIC VERSION COUNT DTYPE VALUES...
  python3 - "$@" << 'EOF'
import struct, sys
path, magic, version, count, dtype = sys.argv[1:6]
values = [int(v) for v in sys.argv[6:]]
header = [int(magic), int(version), int(count)] + [0] * 253
with open(path, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%d%s" % (len(values), "H" if dtype == "u16" else "I"), *values))
EOF
}
tokens=$(python3 -c 'print(" ".join(str((i * 7) % 200) for i in range(600)))')
llmc "$out/v2.bin" 20240520 2 600 u32 $tokens
refused bin_v2 "trainer.data 'bin:$out/v2.bin': '$out/v2.bin' is an llm.c token file .* of header version 2" \
  "${common[@]}" --set trainer.data="bin:$out/v2.bin"
llmc "$out/neg.bin" 20240520 1 -5 u16 $tokens
refused bin_negative "'$out/neg.bin': the llm.c header's token count is negative" \
  "${common[@]}" --set trainer.data="bin:$out/neg.bin"
# uint32 tokens (Llama-3 export, version 7) are read as uint32: 600 tokens, ids below 200.
llmc "$out/u32.bin" 20240801 7 600 u32 $tokens
trains bin_u32 --set trainer.data="bin:$out/u32.bin" --set trainer.steps=1
check "bin_u32: 600 uint32 tokens read" grep -q "bin:$out/u32.bin (600 tokens)" "$out/bin_u32.out"

# Outputs that cannot be written are refused before training time is spent.
touch "$out/afile"
refused save_dir "trainer.save_dir: cannot create the directory '$out/afile/ckpt'" \
  "${common[@]}" --set trainer.save_dir="$out/afile/ckpt" --set trainer.save_interval=1
refused metrics "trainer.metrics_file: cannot write '$out/afile/m.jsonl'" "${common[@]}" \
  --set trainer.metrics_file="$out/afile/m.jsonl"
refused summary "--summary-json: cannot write '$out/afile/s.json'" "${common[@]}" \
  --summary-json "$out/afile/s.json"

# A run of 0 steps writes valid JSON (no NaN).
trains zero_steps --set trainer.steps=0 --summary-json "$out/zero.json"
check "zero_steps: the summary is valid JSON without NaN" python3 -c '
import json, sys
json.load(open(sys.argv[1]), parse_constant=lambda c: sys.exit("non-JSON constant " + c))' \
  "$out/zero.json"

# Checkpoints: `resume: auto` beside complete checkpoints but no `latest`, a hand-edited
# manifest, a FIFO in place of a shard.
ck=(--set trainer.save_dir="$out/ckpt" --set trainer.save_interval=2)
trains save "${ck[@]}" --set trainer.steps=4
rm "$out/ckpt/latest"
refused no_latest "trainer.resume is auto but $out/ckpt/latest is missing while $out/ckpt/step4 is a complete checkpoint \(step 4\): set trainer.resume: step4" \
  "${common[@]}" "${ck[@]}" --set trainer.steps=6 --set trainer.resume=auto
sed -i 's/"optimizer_steps": 4/"optimizer_steps": 40/' "$out/ckpt/step4/manifest.json"
refused edited "$out/ckpt/step4/manifest.json: corrupted: the manifest does not match its manifest_checksum" \
  "${common[@]}" "${ck[@]}" --set trainer.steps=6 --set trainer.resume=step4
rm "$out/ckpt/step2/shard_rank0_of_1.bin"
mkfifo "$out/ckpt/step2/shard_rank0_of_1.bin"
refused shard_fifo "$out/ckpt/step2/shard_rank0_of_1.bin: not a regular file" \
  "${common[@]}" "${ck[@]}" --set trainer.steps=6 --set trainer.resume=step2

# zero-consolidate --out naming a directory: refused, and no .tmp file left behind.
trains save2 --set trainer.save_dir="$out/ck2" --set trainer.save_interval=1 --set trainer.steps=1
mkdir "$out/outdir"
timeout 60 "$consolidate" --checkpoint "$out/ck2" --out "$out/outdir" > /dev/null 2> "$out/cons.err"
check "consolidate into a directory: refused naming it" \
  grep -q "zero-consolidate: error: $out/outdir: is a directory" "$out/cons.err"
check "consolidate into a directory: no .tmp left" test ! -e "$out/outdir.tmp"

summary
