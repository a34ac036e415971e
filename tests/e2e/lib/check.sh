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
