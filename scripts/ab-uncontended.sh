#!/usr/bin/env bash
# Same-machine A/B of the uncontended lock ratio (distlock / raw at p50, the
# closed loop of scenario 2) between two builds of distlock-bench.
#
#   scripts/ab-uncontended.sh OLD_BIN NEW_BIN [PAIRS] [-- BENCH ARGS...]
#
# Runs OLD, NEW, OLD, NEW, ... (PAIRS pairs, 3 by default), each with
# `--only 2 --rate 0 --iterations 2000` (ITERATIONS overrides the count;
# BENCH ARGS are passed to both, e.g. `--backends redis,etcd`), and prints
# per backend each build's mean and spread (min-max) and the difference of
# the means, new - old. Each run's output and the load before it are kept in
# OUT (a new temporary directory unless set).
set -euo pipefail

if [ $# -lt 2 ]; then
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
old=$1 new=$2
shift 2
pairs=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
    pairs=$1
    shift
fi
[ "${1:-}" = "--" ] && shift
out=${OUT:-$(mktemp -d /tmp/ab-uncontended.XXXXXX)}
mkdir -p "$out"
iterations=${ITERATIONS:-2000}

for i in $(seq 1 "$pairs"); do
    for build in old new; do
        bin=$old
        [ "$build" = new ] && bin=$new
        run="$out/$i-$build"
        load=$(uptime | sed 's/.*load average: //')
        echo "$i $build $load" >>"$out/loads"
        echo "run $i $build (load $load)" >&2
        "$bin" --only 2 --rate 0 --iterations "$iterations" "$@" >"$run.md" 2>"$run.log"
    done
done

# One line per run and backend: build, backend, ratio. The ratio is the
# first "distlock / raw at p50" after a closed-loop heading.
for f in "$out"/*-old.md "$out"/*-new.md; do
    build=$(basename "$f" .md)
    build=${build#*-}
    awk -v build="$build" '
        /^#### .*: uncontended, closed loop/ { name = $2; sub(/:$/, "", name); next }
        name != "" && /^distlock \/ raw at p50:/ {
            r = substr($0, index($0, "**") + 2); sub(/\*\*.*/, "", r)
            print build, name, r; name = ""
        }' "$f"
done >"$out/ratios"

echo "loads before each run (1, 5, 15 min):"
sed 's/^/  /' "$out/loads"
echo
echo "| backend | old mean (min-max) | new mean (min-max) | new - old |"
echo "|---|---|---|---|"
awk '
    { k = $1 SUBSEP $2; n[k]++; s[k] += $3
      if (!(k in lo) || $3 < lo[k]) lo[k] = $3
      if (!(k in hi) || $3 > hi[k]) hi[k] = $3
      if (!($2 in seen)) { seen[$2] = 1; order[++m] = $2 } }
    END {
        for (j = 1; j <= m; j++) {
            b = order[j]; o = "old" SUBSEP b; w = "new" SUBSEP b
            if (!(o in n) || !(w in n)) continue
            mo = s[o] / n[o]; mw = s[w] / n[w]
            printf "| %s | %.3f (%.2f-%.2f) | %.3f (%.2f-%.2f) | %+.3f |\n", b, mo, lo[o], hi[o], mw, lo[w], hi[w], mw - mo
        }
    }' "$out/ratios"
echo
echo "runs in $out" >&2
