#!/bin/sh
# The README's test command: the lanes (Makefile targets) in turn, stopping at the first that
# fails, then every lane's wall time, so a CI log's tail shows where the time went.
# A step "a+b" runs lanes a and b at the same time: a's output comes as it runs, b's is kept
# apart and printed whole once both have ended.
# Usage: tools/lanes.sh STEP...
set -u
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
results=""
failed=0

record() {  # lane seconds status
    verdict=ok
    [ "$3" -eq 0 ] || verdict="FAILED (exit $3)"
    results="$results$(printf '  %-22s %5d s  %s' "$1" "$2" "$verdict")
"
    [ "$3" -eq 0 ] || failed=$3
}

timed() {  # lane: runs it, leaves "status seconds" in $logs/lane.rc
    lane_started=$(date +%s)
    make --no-print-directory "$1"
    echo "$? $(( $(date +%s) - lane_started ))" >"$logs/$1.rc"
}

run_together() {  # step: its first lane in the foreground, the others beside it
    first=${1%%+*}
    others=$(printf '%s' "${1#*+}" | tr '+' ' ')
    for lane in $others; do
        timed "$lane" >"$logs/$lane.log" 2>&1 &
    done
    timed "$first"
    wait
    for lane in $first $others; do
        if [ "$lane" != "$first" ]; then
            echo "==== $lane (run alongside $first)"
            cat "$logs/$lane.log"
        fi
        # A lane that left no status was killed before it could say: a failure.
        code=125 took=0
        [ -s "$logs/$lane.rc" ] && read -r code took <"$logs/$lane.rc"
        record "$lane" "$took" "$code"
    done
}

begun=$(date +%s)
for step in "$@"; do
    started=$(date +%s)
    case "$step" in
    *+*)
        run_together "$step"
        record "  (together)" "$(( $(date +%s) - started ))" "$failed"
        ;;
    *)
        make --no-print-directory "$step"
        code=$?
        record "$step" "$(( $(date +%s) - started ))" "$code"
        ;;
    esac
    [ "$failed" -eq 0 ] || break
done
printf '\nlanes (wall time):\n%s  %-22s %5d s\n' "$results" "whole run" "$(( $(date +%s) - begun ))"
exit "$failed"
