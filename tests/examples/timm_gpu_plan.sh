#!/usr/bin/env bash
# timm's own train.py on a GPU box (resnet50, AMP, batch 256, 8,192 JPEGs, -j 4), in one run of at most 10 minutes:
#   bash tests/examples/timm_gpu_plan.sh OUT_DIR TIMM_DIR
# OUT_DIR gets the logs and runs.tgz (the run folders). TIMM_DIR holds timm's train.py as train-<timm version>.py (the box's timm decides which; train.py if none
# matches). Three parts, each its own time limit:
#   1. watched at -j 4 for 40 s (no --tune): the watch's windows against the log's own rate over the same seconds
#      (tests/examples/timm_logged.py stamps the log lines with the wall clock);
#   2. watched with --tune: the pause's pick and its predicted rate, the changes tried;
#   3. train.py by hand at the pick, unwatched: its log's rate against the pick's prediction.
# The machine's CPU reference before and after, as in watch_tune_gpu.sh.
set -uo pipefail
out=${1:?out dir}; timm_dir=${2:?timm dir}
mkdir -p "$out"
keep=/tmp/timm-plan-runs; rm -rf "$keep"; mkdir -p "$keep"
pack() { tar czf "$out/runs.tgz" -C "$keep" .; }  # the run folders so far, in one file (OUT keeps few)
py=python3
ver=$($py -c "import timm; print(timm.__version__.split('.dev')[0])")
train="$timm_dir/train-$ver.py"; [ -f "$train" ] || train="$timm_dir/train.py"
echo "timm $ver, torch $($py -c 'import torch; print(torch.__version__)'), script $(basename "$train")"
data=/tmp/timm-data
$py - <<PY > "$out/dataset.txt" 2>&1
from pipeprof.data.synthetic import make_dataset
print(make_dataset("$data/train", images=8192, classes=10, seed=0))
print(make_dataset("$data/validation", images=256, classes=10, seed=1))
PY
echo "dataset: $(head -1 "$out/dataset.txt")"
ref() { $py - "$1" <<'PY'
import sys
from pipeprof.env import usable_cores
from pipeprof.measure import reference
p = reference.measure(int(usable_cores()["usable"]), 1.5)["points"][-1]
print(f"cpu reference ({sys.argv[1]}): {p['decodes_per_s']:,.0f} decodes/s on {p['processes']} processes "
      f"({p['decodes_per_s_min']:,.0f}-{p['decodes_per_s_max']:,.0f})")
PY
}
job() {  # train.py as a user runs it, through the stamping wrapper; $1 the worker count, $2 the log file
  echo "$py tests/examples/timm_logged.py $train --data-dir $data --train-split train --val-split validation \
    --model resnet50 --amp -b 256 -j $1 --epochs 1000 --log-interval 5 --output /tmp/timm-out"
}
ref "before"
timeout -k 10 150 $py -m pipeprof watch --seconds 40 --stop --out-dir /tmp/pp-watch -- $(job 4) \
  > "$out/watch.log" 2>&1
echo "watch rc=$?"; grep -v '^[0-9.]* Train:' "$out/watch.log" | tail -25
run=$(ls -d /tmp/pp-watch/watch-* | tail -1)
mkdir -p "$keep/watch"; cp "$run"/run.json "$run"/*.parquet "$keep/watch/" 2>/dev/null; pack
timeout -k 10 270 $py -m pipeprof watch --tune --seconds 30 --stop --out-dir /tmp/pp-tune -- $(job 4) \
  > "$out/tune.log" 2>&1
echo "tune rc=$?"; grep -v '^[0-9.]* Train:' "$out/tune.log" | tail -40
run=$(ls -d /tmp/pp-tune/watch-* | tail -1)
mkdir -p "$keep/tune"; cp "$run"/run.json "$run"/*.parquet "$keep/tune/" 2>/dev/null; pack
pick=$($py -c "import json; print(json.load(open('$run/run.json'))['tune'].get('recommended_workers') or 4)")
echo "pick=$pick"
ref "after the watches"
timeout -k 5 75 $(job "$pick") > "$out/pick.log" 2>&1
echo "by hand at -j $pick: rc=$?"; grep 'Train:' "$out/pick.log" | tail -3
ref "after"
ls -la "$out"
