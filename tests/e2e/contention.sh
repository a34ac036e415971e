#!/usr/bin/env bash
# The engine's multi-rank, offload and fake-device tests again, with two busy loops competing
# for the cores: a result that changes with thread scheduling is a race. The rank threads, gloo's
# worker threads, the CPU AdamW pool and the copy engine's late events all get preempted at
# other places than in the ordinary run. Each busy loop ends by itself (timeout) and is killed
# on exit.
set -euo pipefail
train=$1
tests=$(dirname "$train")/../tests
source "$(dirname "${BASH_SOURCE[0]}")/lib/check.sh"
busy=()
trap 'kill "${busy[@]}" 2> /dev/null || true' EXIT
for _ in 1 2; do
  timeout 900 sh -c 'while :; do :; done' &
  busy+=($!)
done
for t in test_engine_equivalence test_optimizer_offload test_phase_peaks test_fake_device \
  test_fake_device_engine test_fake_device_checkpoint test_fake_device_memory \
  test_fake_device_grad_to_host test_fake_device_bound_group; do
  check "$t under two busy loops" "$tests/$t" --gtest_brief=1
done
summary
