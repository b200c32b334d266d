"""``pipeprof``'s command line as argparse reads it: each command, its arguments and their help.

``cli`` dispatches the parsed arguments; nothing here runs or imports more than argparse, so ``--help`` stays
quick.
"""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pipeprof", description="Profile a training input pipeline.")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a sweep (default config when no file is given)")
    run.add_argument("config", nargs="?", help="experiment YAML (see configs/)")
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a config field, value in YAML: --set loader.num_workers=[0,2,4]",
    )
    run.add_argument(
        "--gpus",
        help="GPU counts per trial, e.g. 1,2 or all (distributed.gpus): N > 1 runs as N DDP processes under torchrun",
    )
    run.add_argument(
        "--exhaustive",
        action="store_true",
        help="measure every point of the grid (sweep: exhaustive) instead of searching num_workers",
    )
    run.add_argument("--no-action-trials", action="store_true", help="predict actions only (actions: predict)")
    run.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="finish this run folder: run only its trials that are missing or did not end ok, with "
        "the config (and --set overrides) it was started with, on the same machine",
    )
    doctor = sub.add_parser("doctor", help="the machine as pipeprof sees it")
    doctor.add_argument("--path", default="out", help="dataset path whose filesystem to report")
    doctor.add_argument("--json", action="store_true", help="print the raw snapshot as JSON")
    make = sub.add_parser("make-dataset", help="write a synthetic ImageNet-like dataset (ImageFolder layout)")
    make.add_argument("dir")
    make.add_argument("--images", type=int, required=True)
    make.add_argument("--classes", type=int, default=10)
    make.add_argument("--seed", type=int, default=0)
    _report_parsers(sub)
    _validate_parser(sub)
    _multi_run_parsers(sub)
    pack = sub.add_parser("pack", help="pack an ImageFolder tree into tar shards (WebDataset layout)")
    pack.add_argument("src", help="dataset folder (class folders of images)")
    pack.add_argument("dst", help="folder for shard-000000.tar, ...")
    pack.add_argument("--shard-size", type=float, default=100.0, metavar="MB", help="target shard size in MB (1e6 B)")
    pack.add_argument("--seed", type=int, default=0, help="shuffle seed: every shard mixes classes")
    pack.add_argument("--overwrite", action="store_true", help="replace shards already in DST")
    _check_data_parser(sub)
    _watch_parser(sub)
    _size_parser(sub)
    return p


def _validate_parser(sub) -> None:
    validate = sub.add_parser("validate", help="benchmark: workloads of known answer, expected vs measured")
    validate.add_argument("--out-dir", default="out")
    validate.add_argument(
        "--sizing",
        action="store_true",
        help="check the core-count predictions: re-run the sweep inside CPU masks of fewer cores",
    )
    validate.add_argument("--config", help="with --sizing: the experiment to size (default: a known-answer workload)")
    validate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="with --sizing: override a field of --config",
    )
    validate.add_argument(
        "--cores", help="with --sizing: core counts to check, e.g. 4,8 (default: 1/4 and 1/2 of the usable cores)"
    )
    validate.add_argument("--full-run", help="with --sizing: reuse this run folder as the all-cores run")
    validate.add_argument(
        "--end-to-end-only",
        action="store_true",
        help="with --sizing: the masked runs measure only the end-to-end rate (all cores and all but one), the "
        "figure each prediction is checked by, in about a third of the time (no cores per GPU of their own)",
    )
    validate.add_argument(
        "--no-bracket",
        action="store_true",
        help="with --sizing: no unmasked run before each mask (by default one measures how far the machine moved "
        "since the all-cores run, at its worker count nearest the mask, so a miss can be attributed)",
    )
    validate.add_argument(
        "--machines",
        help="with --sizing: a machines file (as `pipeprof size` reads): each machine with fewer cores than this "
        "one is a mask to check (instead of --cores)",
    )


def _size_parser(sub) -> None:
    size = sub.add_parser("size", help="size a workstation: what each candidate machine delivers for measured runs")
    size.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs of the workloads (models, precisions ...)")
    size.add_argument(
        "--machines", metavar="FILE", help="candidate machines (YAML; configs/machines/example.yaml is one)"
    )
    size.add_argument(
        "--cores", help="without --machines: core counts, comma-separated (default: 4,8,12,16,24,32, as the report's)"
    )
    size.add_argument(
        "--gpus", help="without --machines: GPU counts, comma-separated (default 1; with --offload 1,2,4,8 a node)"
    )
    size.add_argument("--target", type=float, help="share of the GPUs' ceiling to keep (default 0.9, as the report's)")
    size.add_argument(
        "--offload",
        action="store_true",
        help="the remote CPU cores and nodes that feed G GPUs a training node, from a DataLoader run and a Ray run "
        "(data.engine: ray) in either order (docs/ray.md)",
    )
    size.add_argument("--node-cores", type=int, default=32, help="with --offload: cores a remote node (default 32)")
    size.add_argument(
        "--link-gbps", type=float, default=25.0, help="with --offload: the training node's link in Gb/s (default 25)"
    )


def _watch_parser(sub) -> None:
    watch = sub.add_parser("watch", help="run your own training command unchanged and say whether it waits for data")
    watch.add_argument("--seconds", type=float, help="watch this long from the first batch (the job runs on after)")
    watch.add_argument("--steps", type=int, help="watch this many batches of the training loop's loader (rank 0)")
    watch.add_argument(
        "--tune",
        action="store_true",
        help="after the window, pause the loop once, measure its "
        "loader alone at a few worker counts, recommend num_workers, and try the changes that apply to its "
        "dataset and loader (uint8 batches, decode and augment on the GPU, the other decoder, the loader's knobs)",
    )
    watch.add_argument(
        "--tune-max-s",
        type=float,
        default=120.0,
        help="the pause's budget in seconds: curve, hand-off and action trials (actions left out are named)",
    )
    watch.add_argument("--stop", action="store_true", help="stop the job (SIGINT) when the window ends")
    watch.add_argument("--out-dir", default="out")
    watch.add_argument("--window-s", type=float, default=0.75, help="steady-state window length (measure.window_s)")
    watch.add_argument("--live-s", type=float, default=5.0, help="seconds between live lines")
    watch.add_argument(
        "--redraws",
        type=int,
        default=60,
        help="re-draws of the windows for the answer's confidence (measure.redraws; 0: none)",
    )
    watch.add_argument("--log", metavar="FILE", help="pipeprof's own lines go to FILE instead of stderr")
    watch.add_argument(
        "job", nargs=argparse.REMAINDER, metavar="COMMAND", help="-- COMMAND ARGS...: the job, unchanged"
    )


def _multi_run_parsers(sub) -> None:
    merge = sub.add_parser("merge", help="join the run folders of a multi-machine job's nodes into one")
    merge.add_argument("run_dirs", nargs="+", help="each node's run folder, node 0's first")
    merge.add_argument("--out-dir", default="out")
    bench = sub.add_parser("bench", help="benchmarks of pipeprof itself (they print figures)")
    bench.add_argument(
        "which",
        choices=[
            "sweep-speed",
            "soak",
            "repeat",
            "watch-overhead",
            "gpu-augment",
            "action-trials",
            "regress",
            "offload-check",
        ],
        help="sweep-speed: the adaptive search against the exhaustive grid, alternating; soak: "
        "repeated sweeps, printing RSS, open files, /dev/shm and processes (leaks); gpu-augment: "
        "the GPU pipeline's per-sample against its batched transforms, each JPEG decoder alone, and each "
        "beside the step, serial and overlapped; "
        "action-trials: action trials on workloads of known cost, measured against the truth; regress: CONFIG "
        "against an old run's own config (--against RUN_DIR), run A B B A here, through the CI guard; "
        "offload-check: size --offload's prediction for two nodes against a local Ray cluster of two (its runs "
        "take --set, e.g. loader.batch_size=[16])",
    )
    bench.add_argument("--against", metavar="RUN_DIR", help="regress: the base run whose config is run again")
    bench.add_argument(
        "--fail-if-slower", type=float, default=5.0, metavar="PCT", help="regress: the guard's threshold (percent)"
    )
    bench.add_argument("--minutes", type=float, default=30.0, help="soak: how long")
    bench.add_argument(
        "config",
        nargs="?",
        help="sweep-speed: experiment YAML (loader.num_workers unset; default: "
        "the defaults); soak: folder for the runs (default: a temporary one)",
    )
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    bench.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="pairs of runs (the order alternates per pair; default 1, regress 2: A B B A twice); gpu-augment: "
        "timed batches of each form (at least 10)",
    )
    bench.add_argument("--preset", default="standard", help="gpu-augment: the augmentation preset (name or YAML)")
    bench.add_argument("--batch", type=int, default=256, help="gpu-augment: images per batch")
    bench.add_argument("--device", help="gpu-augment: where the pipeline runs (default: cuda where there is one)")
    bench.add_argument(
        "--model",
        default="resnet50",
        help="gpu-augment: the step the decoders are measured beside ('' : none, the decoders alone only)",
    )
    bench.add_argument("--precision", default="bf16", help="gpu-augment: the step's precision")
    bench.add_argument("--times", type=int, default=3, help="repeat: runs of the same config, back to back")
    bench.add_argument("--workers", type=int, default=4, help="action-trials: the loaders' workers")
    bench.add_argument("--pairs", type=int, default=6, help="action-trials: pairs of windows a trial")
    bench.add_argument("--out-dir", default="out/bench")
    bench.add_argument(
        "--steps", type=int, default=200, help="watch-overhead: the script's steps per run, passed as --steps N"
    )
    bench.add_argument(
        "--progress",
        help="watch-overhead: regex of the script's "
        "progress lines, its first group the step count (default: 'step <n>')",
    )
    bench.add_argument("--script-args", default="", help="watch-overhead: the script's other arguments, one string")


def _report_parsers(sub) -> None:
    report = sub.add_parser("report", help="print a saved run's tables again, or write them as HTML or CSV")
    report.add_argument("run_dir")
    report.add_argument(
        "--full", action="store_true", help="every table, footnote and action (the default shows one screen)"
    )
    report.add_argument(
        "--format",
        help="a renderer of pipeprof.report.RENDERERS (text, markdown, html) printed to stdout; default: the console",
    )
    report.add_argument(
        "--html",
        nargs="?",
        const="",
        metavar="FILE",
        help="write the self-contained HTML report to FILE (default: RUN_DIR/report.html)",
    )
    report.add_argument(
        "--csv",
        action="store_true",
        help="write the trials, one row per trial, as RUN_DIR/trials.csv (for spreadsheets)",
    )
    report.add_argument(
        "--to",
        nargs="+",
        metavar=("TRACKER", "WHERE"),
        help="write the run to a tracker: 'tensorboard DIR', 'mlflow [URI]' (default: MLFLOW_TRACKING_URI, else "
        "sqlite beside the run), 'wandb DIR' (offline); each needs its extra: pip install 'pipeprof[TRACKER]'",
    )
    compare = sub.add_parser("compare", help="two or more runs side by side: ratios of matching trials, what differs")
    compare.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="the first is the baseline")
    compare.add_argument(
        "--html",
        default="compare.html",
        metavar="FILE",
        help="where to write the HTML page (default: compare.html here); markdown goes to stdout",
    )
    compare.add_argument(
        "--fail-if-slower",
        type=float,
        nargs="?",
        const=5.0,
        metavar="PCT",
        help="CI guard (two runs): exit 1 when a matching trial of the second is slower than the first by more than "
        "PCT%% (default 5) and beyond the two runs' measured noise; exit 0 within noise",
    )
    compare.add_argument(
        "--allow-other-machine",
        action="store_true",
        help="with --fail-if-slower: compare runs whose machines differ (CPU, cores, GPUs, torch)",
    )


def _check_data_parser(sub) -> None:
    check = sub.add_parser("check-data", help="list a dataset's files that cannot be read or decoded (headers only)")
    check.add_argument("dir", help="dataset folder (class folders of images) or a 'path label' file list")
    check.add_argument("--limit", type=int, help="check at most this many files, evenly spread (default: all)")
    check.add_argument("--max-pixels", type=float, default=50e6, help="list images larger than this (default 50e6)")
