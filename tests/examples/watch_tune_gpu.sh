#!/usr/bin/env bash
# One device call: the examples-style ImageFolder script watched and tuned with actions, then run by hand at
# the recommended count, plain and with the best measured change applied (its own clocks each time).
#   bash tests/examples/watch_tune_gpu.sh OUT_DIR [IMAGES] [VARIANTS]
# VARIANTS: which of the script's forms run by hand after the watch (default "plain uint8 gpu_pipeline"; "plain"
# alone checks the prediction at the pick in about 80 s instead of 210)
# Each step has its own time limit (270 + 3 x 70 s at most), so the whole fits one 10-minute call. The window is
# 30 s: the first steps of a fresh process (cudnn.benchmark) can take most of a shorter one.
set -uo pipefail
out=${1:?out dir}; images=${2:-4096}; variants=${3:-plain uint8 gpu_pipeline}
mkdir -p "$out"
py=python3
data=/tmp/pipeprof-imagenet
$py -c "from pipeprof.data.synthetic import make_dataset as m; print(m('$data', images=$images, classes=8, seed=0))" \
  > "$out/dataset.txt" 2>&1
echo "dataset: $(tail -1 "$out/dataset.txt")"
script=(tests/examples/imagenet_train.py --data "$data" --batch-size 256)
# the machine's CPU speed (pipeprof's fixed-work reference, all cores) before the watch, after it and after the
# script's own runs: where the pause's prediction and the script's clock part, whether the machine moved between
ref() { $py - "$1" <<'PY'
import sys
from pipeprof.env import usable_cores
from pipeprof.measure import reference
p = reference.measure(int(usable_cores()["usable"]), 1.5)["points"][-1]
rate, low, high = p["decodes_per_s"], p["decodes_per_s_min"], p["decodes_per_s_max"]
print(f"cpu reference ({sys.argv[1]}): {rate:,.0f} decodes/s on {p['processes']} processes ({low:,.0f}-{high:,.0f})")
PY
}
ref "before the watch"
timeout -k 10 270 $py -m pipeprof watch --tune --seconds 30 --stop --out-dir /tmp/pipeprof-out -- \
  $py "${script[@]}" --workers 4 --steps 100000 > "$out/watch.log" 2>&1
echo "watch rc=$?"; grep -v '^step ' "$out/watch.log" | tail -45
run=$(ls -d /tmp/pipeprof-out/watch-* | tail -1)
cp "$run/run.json" "$out/run.json"; cp "$run"/*.parquet "$out/" 2>/dev/null
read -r pick best < <($py -c "
import json; t = json.load(open('$run/run.json'))['tune']
print(t.get('recommended_workers') or 4, t.get('best_action') or 'none')")
echo "pick=$pick best=$best"
ref "after the watch"
for variant in $variants; do
  flag=""; [ "$variant" = uint8 ] && flag=--uint8; [ "$variant" = gpu_pipeline ] && flag=--gpu-decode
  echo "== $variant at $pick workers =="
  timeout -k 5 70 $py "${script[@]}" --workers "$pick" --steps 140 --clock $flag 2>&1 | grep -E 'clock|Error|error' | tail -3
done
ref "after the script's runs"
