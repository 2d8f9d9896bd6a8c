#!/usr/bin/env bash
# The nightly hypervisor gate: measure tonight's build and decide it against the last good
# run with the sequential gate (`testbed run --decide-against`: the cells one comparison
# cannot decide are measured again, and a regressed cell too, to confirm it; the night's
# shared shift is taken out and reported), or,
# in A/B mode, decide variant b against variant a measured interleaved in the same run (the
# night's drift falls on both alike); index the run into the results store, look at the
# history with its change points, and exit as the gate says:
#
#   0  pass: no cell regressed, every cell decided, the history finds no lasting
#      regression (this run becomes the new baseline)
#   1  regression: a cell regressed, broke (more failed samples), was redefined or is
#      missing, every cell moved together beyond the threshold (the night's shift), or the
#      history finds a lasting regression in the newest runs; fail the job
#   5  undecided: nothing failed, but some cell could not be decided even after it was
#      measured again; mark the job as a warning (GitLab: allow_failure: exit_codes: [5])
#   2  error: the comparison was refused (TCG against KVM, another CPU model), bad input,
#      the store could not be written, or measuring produced no run; fail the job
#
# The statuses of the gate and `testbed history` are turned into the job's in ONE place,
# decide() below; a status it does not know never passes.
#
# The baseline is the last run that passed, remembered in NIGHTLY_BASELINE_FILE, with the
# samples its own second stage added. `--decide-against` pools it with the accepted nights
# before it (each night's decision.json names its baseline), so one old failed sample never
# blocks the gate and five samples of one night do not bound its precision.
#
# Every step can be overridden from the environment (CI variables, or a test that stubs
# the measuring step):
#   TESTBED               the testbed command (default: testbed; e.g. ".venv/bin/testbed")
#   NIGHTLY_MODE          baseline (default): decide against the last good run;
#                         variants: decide variant b against variant a of tonight's run
#   NIGHTLY_TOPOLOGY      topology to measure (default: gate.yaml, or gate-ab.yaml for variants)
#   NIGHTLY_RUN_CMD       command line that measures and prints the run directory as its
#                         last line (default: "$TESTBED run $NIGHTLY_TOPOLOGY" plus
#                         --decide-against BASE, or a, and --junit)
#   NEW_RUN               tonight's run directory: skip measuring and judge it with one
#                         `testbed compare` (no second stage: a given run cannot grow)
#   BASELINE_RUN          the baseline run directory (default: the one named in
#                         NIGHTLY_BASELINE_FILE; none on the first night)
#   NIGHTLY_BASELINE_FILE where the last good run is remembered
#                         (default: $TESTBED_RESULTS/nightly-baseline)
#   TESTBED_RESULTS       where runs are written and kept between nights (default: ./results)
#   NIGHTLY_DB_URL        postgresql://user@host/db of the fleet's results store; unset:
#                         SQLite in $TESTBED_RESULTS/index.sqlite
#   NIGHTLY_OUT           where the job's reports go (default: ./nightly-out): compare.txt,
#                         compare.xml (JUnit, one testcase per cell), history.txt, history.html
#   NIGHTLY_COMPARE_ARGS  extra options for the gate (e.g. "--threshold 0.10" on a host
#                         whose unchanged cells move more than 5 % between runs, or
#                         "--extra 10" for --decide-against)
set -u -o pipefail

here=$(cd "$(dirname "$0")" && pwd)
read -r -a TB <<< "${TESTBED:-testbed}"
mode=${NIGHTLY_MODE:-baseline}
case "$mode" in
    baseline) topology=${NIGHTLY_TOPOLOGY:-$here/gate.yaml} ;;
    variants) topology=${NIGHTLY_TOPOLOGY:-$here/gate-ab.yaml} ;;
    *) echo "nightly: NIGHTLY_MODE=$mode: expected baseline or variants" >&2; exit 2 ;;
esac
export TESTBED_RESULTS=${TESTBED_RESULTS:-$PWD/results}
out=${NIGHTLY_OUT:-$PWD/nightly-out}
baseline_file=${NIGHTLY_BASELINE_FILE:-$TESTBED_RESULTS/nightly-baseline}
read -r -a compare_args <<< "${NIGHTLY_COMPARE_ARGS:-}"
mkdir -p "$out" "$TESTBED_RESULTS" || exit 2
# tonight's reports only: a stale compare.xml would be read as tonight's verdict
rm -f "$out/compare.txt" "$out/compare.xml" "$out/history.txt" "$out/history.html"

if [ -n "${NIGHTLY_DB_URL:-}" ]; then
    db=$NIGHTLY_DB_URL
    db_name="PostgreSQL (NIGHTLY_DB_URL)"      # the URL may hold a password: never printed
else
    db=$TESTBED_RESULTS/index.sqlite
    db_name="SQLite $db (NIGHTLY_DB_URL unset)"
fi

say() { echo "nightly: $*" >&2; }

# -------------------------------------------------------------------- 1. baseline
base=""
if [ "$mode" = baseline ]; then
    base=${BASELINE_RUN:-}
    if [ -z "$base" ] && [ -s "$baseline_file" ]; then
        base=$(cat "$baseline_file")
    fi
fi

# -------------------------------------------------------------------- 2. measure and decide
# With a baseline (or in A/B mode) the run is the gate: `testbed run --decide-against`
# measures, compares, measures the undecided cells again and exits with the gate's status.
# The first night has nothing to decide against: it is measured, passes and becomes the
# baseline.
gate_rc=none
if [ -n "${NEW_RUN:-}" ]; then
    new=$NEW_RUN
    say "tonight's run given: $new (not measuring; judged by one comparison)"
    [ -f "$new/run.json" ] || { say "$new: not a run directory (no run.json)"; exit 2; }
    if [ "$mode" = variants ]; then
        say "compare: variant b against variant a of $new"
        "${TB[@]}" compare "$new" --variants a b --junit "$out/compare.xml" "${compare_args[@]}" \
            | tee "$out/compare.txt"
        gate_rc=${PIPESTATUS[0]}
    elif [ -n "$base" ]; then
        say "compare: $new against the baseline $base"
        "${TB[@]}" compare "$base" "$new" --junit "$out/compare.xml" "${compare_args[@]}" \
            | tee "$out/compare.txt"
        gate_rc=${PIPESTATUS[0]}
    fi
else
    say "measuring $topology"
    "${TB[@]}" validate "$topology" >&2 || exit 2
    against=()
    if [ "$mode" = variants ]; then
        against=(--decide-against a --junit "$out/compare.xml" "${compare_args[@]}")
        say "deciding variant b against variant a, measured interleaved in one run"
    elif [ -n "$base" ]; then
        against=(--decide-against "$base" --junit "$out/compare.xml" "${compare_args[@]}")
        say "deciding against the baseline $base"
    else
        say "no baseline yet (first night): no verdict; this run becomes the baseline"
    fi
    if [ -n "${NIGHTLY_RUN_CMD:-}" ]; then
        run_out=$(bash -c "$NIGHTLY_RUN_CMD")
    else
        run_out=$("${TB[@]}" run "$topology" "${against[@]}")
    fi
    run_rc=$?
    new=$(printf '%s\n' "$run_out" | tail -n 1)
    if [ ! -f "$new/run.json" ]; then
        say "measuring failed (exit $run_rc) and left no run directory"
        [ "$run_rc" -eq 0 ] || [ "$run_rc" -eq 5 ] || [ "$run_rc" -eq 1 ] && exit 2
        exit "$run_rc"
    fi
    if [ ${#against[@]} -gt 0 ]; then
        printf '%s\n' "$run_out" | sed '$d' > "$out/compare.txt"
        cat "$out/compare.txt"
        gate_rc=$run_rc
    elif [ "$run_rc" -gt 1 ]; then
        # `testbed run` exits 1 when a sample failed: the run still stands. Anything else
        # left no usable run.
        say "measuring failed (exit $run_rc)"
        exit 2
    fi
fi

# -------------------------------------------------------------------- 3. index, history
say "index into $db_name"
if "${TB[@]}" index --db "$db" "$new" ${base:+"$base"} >&2; then
    "${TB[@]}" history --db "$db" -o "$out/history.html" > "$out/history.txt"
    history_rc=$?
else
    say "indexing failed: no history tonight"
    history_rc=noindex
fi

# -------------------------------------------------------------------- 4. decide
# The one place where the tools' statuses become the job's. gate (`run --decide-against`
# or `compare`): 0 pass, 1 regression, 5 undecided, 2 refused or bad input, "none" on the
# first night. history: 0 nothing new, 1 a confirmed lasting regression in the newest runs
# of some series, "noindex" if the store failed. Status values a newer testbed may add
# fall to the warning or error branches, never to a pass.
decide() {
    case "$1:$2" in
        1:*)               echo 1 "regression: see compare.txt / compare.xml" ;;
        [0n5]*:noindex)    echo 2 "error: the results store could not be written" ;;
        [0n5]*:1)          echo 1 "regression: the history finds a lasting regression in the newest runs (history.txt)" ;;
        5:*)               echo 5 "undecided: some cell could not be decided (compare.txt says which)" ;;
        0:0 | none:0)      echo 0 "pass" ;;
        0:* | none:*)      echo 5 "warning: testbed history exited $2, a status this script does not know" ;;
        *)                 echo 2 "error: the gate exited $1 (refused or bad input: compare.txt)" ;;
    esac
}
read -r status why <<< "$(decide "$gate_rc" "$history_rc")"
say "gate ${gate_rc}, history ${history_rc}: $why"

# A run that passed (or the first night's) is tomorrow's baseline; after a regression or an
# undecided night the last good run stays, so a regression keeps failing until it is fixed
# (or an operator names a new baseline in $baseline_file).
if [ "$mode" = baseline ] && [ "$status" -eq 0 ]; then
    printf '%s\n' "$(cd "$new" && pwd)" > "$baseline_file"
    say "baseline is now $new"
fi
exit "$status"
