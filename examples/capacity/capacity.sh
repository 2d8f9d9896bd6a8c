#!/usr/bin/env bash
# From a density run to the capacity table and plot for one per-VM traffic profile:
#
#   examples/capacity/capacity.sh            # measure density.yaml, then plan
#   examples/capacity/capacity.sh RUN        # plan from a run measured before
#
# Writes into $CAPACITY_OUT (default ./capacity-out):
#   capacity.txt   the table: VMs per host per attachment mode, the limit that gives the
#                  answer (cpu, memory, vcpu, link, evidence), the measured points beside the fit
#   capacity.json  the same, machine-readable
#   capacity.html  the run's report with, per mode, per-pair rate and host CPU against the
#                  number of pairs, the fitted model, and the capacity table
# Exit: testbed's own status (0 ok; 2 bad input, e.g. an unparseable profile; 3 a missing
# capability while measuring). A measured run with failed samples (exit 1) is still planned
# from, with a warning: the fit uses the successful samples and says how many.
#
# Environment:
#   TESTBED            the testbed command (default: testbed)
#   CAPACITY_TOPOLOGY  what to measure (default: density.yaml beside this script)
#   CAPACITY_PROFILE   the per-VM traffic (default: stream:2gbit; or rr:5ktps, stream:500mbit)
#   CAPACITY_ARGS      the planned host, when it is not this one: e.g. "--host-cores 64
#                      --host-memory-mib 262144 --memory-mib 4096 --link-gbit 25 --headroom 0.2"
#   CAPACITY_OUT       where the three files go
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
read -r -a TB <<< "${TESTBED:-testbed}"
read -r -a plan_args <<< "${CAPACITY_ARGS:-}"
profile=${CAPACITY_PROFILE:-stream:2gbit}
topology=${CAPACITY_TOPOLOGY:-$here/density.yaml}
out=${CAPACITY_OUT:-$PWD/capacity-out}
mkdir -p "$out" || exit 2
say() { echo "capacity: $*" >&2; }

if [ $# -ge 1 ]; then
    run=$1
else
    "${TB[@]}" validate "$topology" >&2 || exit $?
    say "measuring $topology"
    run_out=$("${TB[@]}" run "$topology")
    rc=$?
    run=$(printf '%s\n' "$run_out" | tail -n 1)
    if [ "$rc" -eq 1 ] && [ -f "$run/run.json" ]; then
        say "some samples failed (see $run/run.json); planning from the successful ones"
    elif [ "$rc" -ne 0 ]; then
        exit "$rc"
    fi
fi

say "planning $profile per VM from $run"
"${TB[@]}" capacity "$run" --profile "$profile" "${plan_args[@]}" | tee "$out/capacity.txt"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || exit "$rc"
"${TB[@]}" capacity "$run" --profile "$profile" "${plan_args[@]}" --json > "$out/capacity.json" || exit $?
"${TB[@]}" report "$run" -o "$out/capacity.html" --capacity-profile "$profile" || exit $?
say "wrote $out/capacity.txt, capacity.json, capacity.html"
