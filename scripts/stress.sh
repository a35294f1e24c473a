#!/usr/bin/env bash
# Runs a command (default: make test) with every core kept busy by a competing
# load: one busy process per core (`yes`, at the caller's niceness), started
# before the command and killed after it, however it ends. A test that fails
# only like this waits on time instead of on its event (docs/testing.md,
# "Under load"). `make test-stress` runs it after set-up, so the load meets
# the tests, not the compiler.
#   bash scripts/stress.sh [COMMAND...]    STRESS_PROCS=N: N busy processes
set -u
procs=${STRESS_PROCS:-$(nproc)}
# Ray starts its workers at niceness 15, below a load at the caller's: they
# would get a few percent of a core and every Ray test would crawl (starved,
# not loaded). At the load's niceness they compete as our own ranks do.
export RAY_worker_niceness=${RAY_worker_niceness:-0}
[ $# -gt 0 ] || set -- make test
pids=()
cmd=
stop_load() {
    [ -n "$cmd" ] && kill "$cmd" 2>/dev/null
    [ ${#pids[@]} -eq 0 ] && return
    kill "${pids[@]}" 2>/dev/null
    wait "${pids[@]}" 2>/dev/null
    pids=()
}
trap stop_load EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for _ in $(seq "$procs"); do
    yes >/dev/null &
    pids+=($!)
done
echo "[stress] $procs busy processes (${pids[*]}), then: $*"
start=$SECONDS
# In the background, so a signal to this script runs its trap at once (bash
# waits for a foreground command first); a Ctrl-C reaches both anyway.
"$@" &
cmd=$!
wait "$cmd"
rc=$?
cmd=
echo "[stress] exit $rc after $((SECONDS - start)) s beside $procs busy processes"
exit $rc
