#!/bin/bash
# Wall time of one `variants search` per executor: the same settings, warm caches (a first
# "warm" run fills the reference and sensitivity caches), a fresh --out each time so every
# candidate is evaluated. Appends "<name> <seconds>" lines to $DIR/times.txt.
#
#   PYTHONPATH=$PWD bash bench/search_executors.sh /tmp/bench-search warm local proc2 ray2 ray1 local
#
# Measured on the 2-core dev machine: see the README's search section.
set -u
DIR=$1; shift
PY=${PYTHON:-python}
COMMON="--model minilm-sentiment --cost bytes --strategy bisect --batch 2 --n-search 400
        --n-sensitivity 100 --chunk-size 50 --bits 4 6 8 --no-finalize --no-progress
        --results-dir $DIR/r"
mkdir -p "$DIR"
for n in "$@"; do
  case $n in
    warm|local) extra="" ;;
    proc1) extra="--executor process --workers 1" ;;
    proc2) extra="--executor process --workers 2" ;;
    ray1) extra="--executor ray --workers 1" ;;
    ray2) extra="--executor ray --workers 2" ;;
    *) echo "unknown run $n (warm, local, proc1, proc2, ray1, ray2)"; exit 2 ;;
  esac
  rm -rf "$DIR/$n"
  s=$(date +%s.%N)
  $PY -m variants search $COMMON $extra --out "$DIR/$n" > "$DIR/$n.log" 2>&1
  rc=$?
  e=$(date +%s.%N)
  echo "$n $(echo "$e - $s" | bc) rc=$rc" | tee -a "$DIR/times.txt"
done
