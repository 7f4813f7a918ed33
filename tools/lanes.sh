#!/bin/sh
# The README's test command: the lanes (Makefile targets) in turn, stopping at the first that
# fails, then every lane's wall time, so a CI log's tail shows where the time went.
# A step "a+b" runs lanes a and b at the same time (their output is kept apart, each printed
# whole when both have ended): the CPU-bound unit lanes share the machine's two cores.
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
}

run_step() {
    step=$1
    started=$(date +%s)
    case "$step" in
    *+*)
        lanes=$(printf '%s' "$step" | tr '+' ' ')
        for lane in $lanes; do
            ( lane_started=$(date +%s); make --no-print-directory "$lane" >"$logs/$lane.log" 2>&1
              echo "$? $(( $(date +%s) - lane_started ))" >"$logs/$lane.rc" ) &
        done
        wait
        for lane in $lanes; do
            echo "==== $lane (run alongside: $step)"
            cat "$logs/$lane.log"
            read -r code took <"$logs/$lane.rc"
            record "$lane" "$took" "$code"
            [ "$code" -eq 0 ] || failed=$code
        done
        record "  together" "$(( $(date +%s) - started ))" "$failed"
        ;;
    *)
        make --no-print-directory "$step"
        code=$?
        record "$step" "$(( $(date +%s) - started ))" "$code"
        [ "$code" -eq 0 ] || failed=$code
        ;;
    esac
}

begun=$(date +%s)
for step in "$@"; do
    run_step "$step"
    [ "$failed" -eq 0 ] || break
done
printf '\nlanes (wall time):\n%s  %-22s %5d s\n' "$results" "whole run" "$(( $(date +%s) - begun ))"
exit "$failed"
