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
# `free_port LOW`: a port in [LOW, LOW + 2000) that nothing listens on or is bound to now. A bare
# random pick collided on a loaded machine (rank 0 then fails with EADDRINUSE, not the error the
# test expects); the check leaves only the race with a program binding it in the next seconds.
# Callers pick LOW below 32768, the start of Linux's ephemeral range (ip_local_port_range), and
# each script its own 2000: the gloo and store connections of the tests ctest runs beside this
# one take their ports from the ephemeral range, never from below it.
free_port() {
  local low=${1:-20000} p
  for _ in $(seq 50); do
    p=$((low + RANDOM % 2000))
    if python3 -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' \
      "$p" 2> /dev/null; then
      echo "$p"
      return
    fi
  done
  echo "$p"
}
