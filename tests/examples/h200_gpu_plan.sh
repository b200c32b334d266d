#!/usr/bin/env bash
# The GPU figures the open issues still owe, one part per device call (each fits the 10-minute limit with room):
#   bash tests/examples/h200_gpu_plan.sh PART OUT_DIR
#   gpu-pipeline  #41: the GPU tests, `bench gpu-augment` of both presets without a step (each op alone, the resize
#                 as Triton kernel and as roi_align, each decoder alone; nvimgcodec where its wheel was carried), then
#                 the CPU pipeline against the GPU's serial, overlapped and staged (configs/h200-gpu-pipeline.yaml,
#                 standard and heavy, nvJPEG). The bench beside the step (each decoder in the three modes) is
#                 `bench gpu-augment --preset standard` alone: it takes more than two minutes
#   watch-tune    #38: tests/examples/watch_tune_gpu.sh (the examples script watched, tuned, applied by hand)
#   sizing        #39: the 16-core run of both presets (standard, heavy; 4, 8 and 16 workers) that the size table
#                 reads; no masked run (the three masks with their end-to-end trials take a call of their own)
#   sizing-masks [CORES]  the same table against runs inside CPU masks, one mask a call (default 4; then 8, then
#                 12): end-to-end only, at all cores and all but one, after an unmasked bracket run of the same
#                 workloads that reads how far the machine moved since the 16-core run; two masks with their
#                 brackets ran past the call's limit; reusing the first
#                 part's 16-core run: copy its folder from that call's
#                 OUT/runs/sizing-all-* into .plan/ (git-ignored by /.plan/ in .git/info/exclude) and carry .plan
#   sizing-pairs [PRESET]  the 16-core run of one preset (default standard) at 4, 8, 12 and 16 workers with masked
#                 pairs at 4, 8 and 12 (trials cores_pair: each end to end, its windows alternated between all 16
#                 CPUs and a mask of as many CPUs as workers), then `size` on it: the model against the pairs, the
#                 machine's moves between runs paired out; no action trials. Not yet timed on a box: each pair
#                 trial stops at measure.max_trial_s, and the timeout below bounds the whole
# Run from the repository root after the device README's install line; each part writes a log and its run
# folders' run.json / trials.parquet under OUT_DIR, and tars them into OUT_DIR/res.tgz.
set -uo pipefail
part=${1:?part}; out=${2:?out dir}
mkdir -p "$out"
py=python3
runs=/tmp/pipeprof-plan/$part  # this part's runs only (a warm machine keeps an earlier part's)
rm -rf "$runs"; mkdir -p "$runs"
case "$part" in
  gpu-pipeline)  # the limits leave about 40 s of the call's 600 for start-up and the copies
    t0=$SECONDS
    $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
    # the GPU tests first (the Triton kernels against the CPU's torch forms; overlapped batches byte-identical);
    # GPU_TESTS=0 leaves them out (a call that spends its time on the run)
    if [ "${GPU_TESTS:-1}" != 0 ]; then
      timeout -k 5 70 $py -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_augment.py tests/test_gpu_overlap.py \
        > "$out/gpu-tests.log" 2>&1
      echo "gpu tests rc=$?"; tail -4 "$out/gpu-tests.log"
    fi
    # each preset's ops alone (decode, each op; the resize as kernel and as roi_align), no step beside them;
    # PRESETS (default standard,heavy) and OVERLAP (default the config's) narrow the part, BENCH=0 leaves the bench out
    presets=${PRESETS:-standard,heavy}
    for preset in $([ "${BENCH:-1}" = 0 ] || echo "${presets//,/ }"); do
      timeout -k 5 45 $py -m pipeprof bench gpu-augment --preset $preset --model '' --out-dir "$runs/$preset" \
        > "$out/bench-$preset.log" 2>&1
      echo "bench $preset rc=$?"; grep -A20 '^| step' "$out/bench-$preset.log"  # the ops, then the resize both ways
    done
    # PLAN_S: the part's whole budget in seconds (less where the session has less device time left); ACTIONS=predict
    # leaves the GPU pipeline's action trial out (up to the config's actions_max_s a preset)
    left=$((${PLAN_S:-555} - (SECONDS - t0))); [ "$left" -ge 240 ] || left=240
    timeout -k 10 "$left" $py -m pipeprof run configs/h200-gpu-pipeline.yaml --set "out_dir=$runs" \
      --set "augment.preset=[$presets]" ${OVERLAP:+--set "augment.overlap=[$OVERLAP]"} \
      ${ACTIONS:+--set "actions=$ACTIONS"} > "$out/run.log" 2>&1
    echo "run rc=$? in $((SECONDS - t0)) s"; tail -60 "$out/run.log"
    ;;
  watch-tune)
    bash tests/examples/watch_tune_gpu.sh "$out" 4096
    ;;
  sizing | sizing-masks)
    presets=(--set "augment.preset=[standard,heavy]" --set "loader.num_workers=[4,8,16]")
    if [ "$part" = sizing ]; then
      timeout -k 10 420 $py -m pipeprof run configs/h200-sizing.yaml "${presets[@]}" --set name=sizing-all \
        --set "out_dir=$runs" > "$out/sizing.log" 2>&1
      echo "run rc=$?"; tail -40 "$out/sizing.log"
      $py -m pipeprof size "$runs"/sizing-all-* >> "$out/sizing.log" 2>&1; tail -25 "$out/sizing.log"
    else
      full=$(ls -d .plan/sizing-all-* 2>/dev/null | head -1)
      [ -n "$full" ] || { echo "no .plan/sizing-all-* folder: run part sizing first and carry its run" >&2; exit 2; }
      timeout -k 10 545 $py -m pipeprof validate --sizing --config configs/h200-sizing.yaml --cores "${3:-4}" \
        --end-to-end-only --full-run "$full" "${presets[@]}" --out-dir "$runs" > "$out/sizing.log" 2>&1
      echo "validate rc=$?"; tail -60 "$out/sizing.log"
    fi
    ;;
  sizing-pairs)
    timeout -k 10 540 $py -m pipeprof run configs/h200-sizing.yaml --set "augment.preset=[${3:-standard}]" \
      --set "loader.num_workers=[4,8,12,16]" --set "trials=[gpu_ceiling,cpu_pipeline,end_to_end,handoff,cores_pair]" \
      --set actions=predict --set name=sizing-pairs --set "out_dir=$runs" > "$out/sizing.log" 2>&1
    echo "run rc=$?"; tail -30 "$out/sizing.log"
    $py -m pipeprof size "$runs"/sizing-pairs-* --cores 4,8,12,16 >> "$out/sizing.log" 2>&1; tail -24 "$out/sizing.log"
    ;;
  *)
    echo "unknown part $part: gpu-pipeline, watch-tune, sizing, sizing-masks, sizing-pairs" >&2; exit 2
    ;;
esac
find "$runs" -name run.json | while read -r f; do  # each run folder's record, wherever the command nested it
  d=$(dirname "$f"); mkdir -p "$out/runs/$(basename "$d")"
  cp "$d"/run.json "$d"/trials.parquet "$out/runs/$(basename "$d")/" 2>/dev/null
done
tar czf /tmp/pipeprof-res.tgz --exclude=./res.tgz -C "$out" . && mv /tmp/pipeprof-res.tgz "$out/res.tgz"
