# Sourced by the e2e scripts: `check NAME COMMAND...` records one pass/fail, `summary` prints
# "N passed, M failed" and returns non-zero if anything failed.
passed=0
failed=0
check() {
  local name=$1
  shift
  if "$@"; then
    echo "PASS $name"
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    failed=$((failed + 1))
  fi
}
summary() {
  echo "$passed passed, $failed failed"
  [[ $failed -eq 0 ]]
}

# use_scratch: a scratch folder $out and a list $pids of background processes, killed (kill -9)
# and removed when the script exits, however it exits.
use_scratch() {
  out=$(mktemp -d)
  pids=()
  trap '_scratch_cleanup' EXIT
}
_scratch_cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2> /dev/null; done
  rm -rf "$out"
}
