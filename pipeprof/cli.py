"""``pipeprof`` command line: a thin dispatcher onto the Python API.

Exit status: 0 done, 1 a run without an answer (every trial of a kind the answer needs failed: status
'failed: <cause>'), 2 bad input (config, arguments, missing folder, a run folder that cannot be resumed)
before anything ran, 130 / 143 a run stopped by SIGINT
(Ctrl-C) / SIGTERM (128 + the signal's number, as a shell reports a process the signal killed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys


def _parser() -> argparse.ArgumentParser:
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
    size.add_argument("--gpus", default="1", help="without --machines: GPU counts, comma-separated")
    size.add_argument("--target", type=float, help="share of the GPUs' ceiling to keep (default 0.9, as the report's)")


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
        choices=["sweep-speed", "soak", "repeat", "watch-overhead", "gpu-augment", "action-trials", "regress"],
        help="sweep-speed: the adaptive search against the exhaustive grid, alternating; soak: "
        "repeated sweeps, printing RSS, open files, /dev/shm and processes (leaks); gpu-augment: "
        "the GPU pipeline's per-sample against its batched transforms, each JPEG decoder alone, and each "
        "beside the step, serial and overlapped; "
        "action-trials: action trials on workloads of known cost, measured against the truth; regress: CONFIG "
        "against an old run's own config (--against RUN_DIR), run A B B A here, through the CI guard",
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


class Signals:
    """SIGINT and SIGTERM during ``pipeprof run``. The first raises KeyboardInterrupt in the main thread: the
    sweep abandons the window in progress (its trial's loader closes, its workers stop), keeps every
    completed trial, and the run folder is finished from what exists, status 'interrupted'. A second exits
    at once (128 + its number) after killing the run's child processes: every file of a run folder is
    written to a temporary name and renamed (``results``), so none is left half-written."""

    def __init__(self):
        self.first: int | None = None
        self._old: dict = {}

    def __enter__(self) -> "Signals":
        self._old = {s: signal.signal(s, self._on) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _on(self, signum: int, frame) -> None:
        if self.first is not None:
            _kill_children()
            os._exit(128 + signum)
        self.first = signum
        raise KeyboardInterrupt(signal.Signals(signum).name)

    def exit_code(self, code: int) -> int:
        """128 + the first signal's number once one came, else ``code``."""
        return code if self.first is None else 128 + self.first


def _kill_children() -> None:
    """SIGKILL to every process this one started (loader workers, an N-GPU job and its ranks)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass


def cmd_run(args) -> int:
    from rich.console import Console

    from pipeprof import config as cfgmod

    extra = (
        (["sweep=exhaustive"] if args.exhaustive else [])
        + (["actions=predict"] if args.no_action_trials else [])
        + ([f"distributed.gpus={args.gpus if args.gpus == 'all' else '[' + args.gpus + ']'}"] if args.gpus else [])
    )
    cfg = cfgmod.load(args.config, args.overrides + extra)
    console = Console(width=None if Console().is_terminal else 140)  # a log file gets the wide tables
    with Signals() as signals:
        try:
            code = _run_and_report(cfg, args.resume, console, signals)
        except KeyboardInterrupt:  # before the run folder existed, or while its analysis was written
            console.print("[yellow]interrupted: what was saved is in the run folder, if one was made[/yellow]")
            code = 130
        return signals.exit_code(code)


def _run_and_report(cfg, resume, console, signals: Signals) -> int:
    """The run with a progress bar, then its summary, console tables and report.html; the exit status."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from pipeprof.orchestrate.runner import execute
    from pipeprof.report.console import print_answer, render_console, render_markdown
    from pipeprof.report.summary import answer_lines

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("preparing", total=None)

        def progress(spec, i, n):
            bar.update(task, total=n, completed=i, description=spec.trial_id if spec else "done")

        shown: list = []  # the answer as printed when the run had it

        def answer(r):
            print_answer(r, console)
            shown[:] = answer_lines(r)

        run = execute(cfg, log=console.print, progress=progress, resume=resume, on_answer=answer)
    if signals.first is not None:
        run.meta["interrupted_by"] = signal.Signals(signals.first).name
        run.save_meta()
    run.save_summary(render_markdown(run))
    # the report's answer again only where the action trials since changed it (else the same lines twice)
    render_console(run, console, answer=shown != answer_lines(run))
    _write_html(run, console)
    if run.meta["status"] == "interrupted":
        console.print(
            f"[yellow]interrupted: the trials measured so far are saved; `pipeprof run --resume "
            f"{run.path}` (with the same config) runs the rest[/yellow]",
            highlight=False,
        )
        return 130
    return 1 if run.meta["status"].startswith("failed") else 0  # no answer: said first (analysis.failures)


def cmd_doctor(args) -> int:
    from pipeprof.report.doctor import render_doctor

    from .env import snapshot

    snap = snapshot(args.path)
    print(json.dumps(snap, indent=2)) if args.json else render_doctor(snap)
    return 0


def cmd_make_dataset(args) -> int:
    from pipeprof.data.synthetic import make_dataset

    stats = make_dataset(args.dir, args.images, args.classes, args.seed)
    print(
        f"wrote {stats.images} images in {stats.classes} classes to {stats.path}: mean {stats.mean_kb:.1f} KB, "
        f"{stats.mean_width:.0f}x{stats.mean_height:.0f} px mean, {stats.total_mb:.1f} MB in all, "
        f"Pillow decode {stats.decode_ms_per_image:.2f} ms/image (one core, bytes in memory)"
    )
    return 0


def _write_html(run, console) -> None:
    """report.html beside the run; a rendering failure is reported, never loses the measured run."""
    from pipeprof.report.html import write_report

    try:
        console.print(f"report: {write_report(run)}", highlight=False)
    except Exception as exc:  # noqa: BLE001 - any renderer bug: the run folder is already saved
        console.print(f"[yellow]report.html not written: {type(exc).__name__}: {exc}[/yellow]", highlight=False)


def cmd_report(args) -> int:
    from pipeprof.report.console import render_console

    from .report import render
    from .results import load_run

    run = load_run(args.run_dir, partial=True)  # a damaged folder: report what can be read
    watched = run.meta.get("kind") == "watch"  # a watch's own answer (the ranks, the pause) goes on top
    if args.to:
        from pipeprof.report.trackers import export

        if len(args.to) > 2:
            raise ValueError(f"--to takes a tracker and where to write it, not {len(args.to)} values: {args.to}")
        print(f"wrote {args.to[0]}: {export(run, args.to[0], args.to[1] if len(args.to) > 1 else None)}")
        return _problems(run)
    if args.html is not None or args.csv:
        from pipeprof.report.html import write_report

        if args.html is not None:
            written = write_report(run, args.html or None)
            if watched:
                from pipeprof.watch.page import with_watch_section

                with_watch_section(run, run.meta.get("tune"), written)
            print(f"wrote {written}")
        if args.csv:
            run.trials.to_csv(run.path / "trials.csv", index=False)
            print(f"wrote {run.path / 'trials.csv'}")
        return _problems(run)
    if watched and not args.format:
        from pipeprof.watch.live import summary

        print("\n".join(summary(run, run.meta.get("tune"))[:-1]))
    print(render(run, args.format), end="") if args.format else render_console(run, full=args.full)
    return _problems(run)


def _problems(run) -> int:
    """Exit 2 when a file of the run folder was missing or unreadable, after saying which."""
    for problem in run.problems:
        print(f"pipeprof report: {problem}", file=sys.stderr)
    return 2 if run.problems else 0


def cmd_compare(args) -> int:
    from pathlib import Path

    from pipeprof.analysis.compare import compare
    from pipeprof.report.comparison import render_compare_html, render_compare_markdown

    from .results import load_measured

    if args.fail_if_slower is not None and (len(args.run_dirs) != 2 or not 0 <= args.fail_if_slower < 100):
        raise ValueError(
            "--fail-if-slower compares two runs, BASE NEW, with a threshold in percent from 0 to 100 (got "
            f"{len(args.run_dirs)} runs, {args.fail_if_slower:g}%)"
        )
    runs = [load_measured(d) for d in args.run_dirs]
    labels = [r.path.name for r in runs]
    result = compare(runs, labels)
    Path(args.html).write_text(render_compare_html(result, runs), encoding="utf-8")
    print(render_compare_markdown(result, runs), end="")
    print(f"\nwrote {args.html}", file=sys.stderr)
    if args.fail_if_slower is None:
        return 0
    from pipeprof.analysis.guard import guard, lines

    # matched as the table above matched them: across the settings the new run changed wholesale
    found = guard(runs[0], runs[1], args.fail_if_slower / 100, args.allow_other_machine, result.changed[labels[1]])
    for line in lines(found):
        print(f"guard: {line}")
    return 1 if found.failed else 2 if found.verdict == "other machine" else 0


def cmd_validate(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from pipeprof.checks.validate import run_validation

    console = Console(width=None if Console().is_terminal else 140)
    if args.sizing:
        return _validate_sizing(args, console)
    df = run_validation(args.out_dir, progress=lambda c: console.print(f"running {c.name}", style="dim"))
    t = Table(title="pipeprof validate: known answers", title_justify="left")
    for h in (
        "case",
        "expected/s",
        "measured/s",
        "err",
        "expected verdict",
        "reported",
        "re-draws",
        "predicted/s",
        "pred err",
    ):
        t.add_column(h, justify="left" if h in ("case", "expected verdict", "reported") else "right")
    for _, r in df.iterrows():
        share = r.get("answer_share")
        t.add_row(
            r["case"],
            f"{r['expected_samples_per_s']:.1f}",
            f"{r['measured_samples_per_s']:.1f}",
            f"{r['rate_error_frac']:+.1%}",
            r["expected_verdict"],
            str(r["reported_verdict"]) + (f" (also {r['also']})" if r.get("also") else ""),
            "–" if share is None or share != share else f"{share:.0%}",
            f"{r['predicted_samples_per_s']:.1f}",
            f"{r['prediction_error_frac']:+.1%}",
        )
    console.print(t)
    agree = int(df["verdict_right"].sum())
    console.print(
        f"verdicts agree in {agree} of {len(df)} cases, {int(df['passed'].sum())} of {len(df)} pass "
        f"(verdict, and rate within ±15%, or lower by the share of a core other processes took: up to "
        f"{df['foreign_cores'].max():.2f} here); median |rate error| "
        f"{df['rate_error_frac'].abs().median():.1%}; median |prediction error| "
        f"{df['prediction_error_frac'].abs().median():.1%}"
    )
    return 0 if df["passed"].all() else 1


def _validate_sizing(args, console) -> int:
    from pipeprof import config as cfgmod

    from .analysis import workstation as ws
    from .checks import sizing
    from .env import usable_cores
    from .report.workstation import render_pairs
    from .results import load_run

    raw: dict = dict(sizing.KNOWN)
    if args.config:
        cfgmod.load(args.config, args.overrides)  # bad input fails here, before any run
        import yaml

        raw = yaml.safe_load(open(args.config)) or {}
    usable = usable_cores()["usable"]
    if args.machines:  # the size table's candidates of fewer cores than this machine: each one a mask
        import yaml

        from .analysis.workstation import parse_machines

        cores = sorted({m.cores for m in parse_machines(yaml.safe_load(open(args.machines))) if m.cores < usable})
        if not cores:
            raise ValueError(f"--machines {args.machines}: no machine has fewer cores than this one ({usable:g})")
    else:
        cores = _counts(args.cores, "--cores") if args.cores else sizing.default_core_counts(usable)
    df, size = sizing.check(
        raw,
        cores,
        f"{args.out_dir}/sizing",
        args.overrides,
        args.full_run,
        progress=lambda text: console.print(f"running {text}", style="dim"),
        end_to_end_only=args.end_to_end_only,
        bracket=not args.no_bracket,
    )
    _print_sizing(console, df)
    _print_size_check(console, size)
    pairs = render_pairs(ws.masked_pairs(load_run(df.iloc[0]["run"])))
    if pairs:
        console.print(pairs, markup=False, highlight=False)
    s = sizing.summary(df)
    spread = "not measured" if s["cores_per_gpu_spread_frac"] is None else f"{s['cores_per_gpu_spread_frac']:.0%}"
    worst = "–" if s["max_rate_error_frac"] is None else f"{s['max_rate_error_frac']:.1%}"
    after = s["max_error_after_move_frac"]
    after = "" if after is None else f" ({after:.1%} after each mask's bracket move: what the model owns)"
    parts = sizing.split_summary(size)
    if parts:
        after += (
            f"; of the size table's errors, the model's cores at worst {parts['cores_error_frac']:+.1%}, each "
            f"sample's CPU moved up to {parts['cost_move_frac']:+.1%}"
        )
    console.print(
        f"largest |predicted − measured| {worst}{after} (target ≤ "
        f"{sizing.TARGET_RATE_ERR:.0%}); cores per GPU spread across runs {spread} (target ≤ "
        f"{sizing.TARGET_CORES_SPREAD:.0%}): {'pass' if s['passed'] else 'FAIL'}"
    )
    return 0 if s["passed"] else 1


def _print_sizing(console, df) -> None:
    """The check's first table: per core count, the all-cores run's prediction beside the masked run's rate, the
    error, the machine's moves, and each run's own cores per GPU."""
    from rich.table import Table

    t = Table(
        title="pipeprof validate --sizing: predicted from the all-cores run vs measured in a CPU mask",
        title_justify="left",
    )
    for h in (
        "cores",
        "CPUs",
        "predicted/s",
        "measured/s",
        "at w",
        "err",
        "moved",
        "err after",
        "core",
        "cores per GPU",
    ):
        t.add_column(h, justify="left" if h == "CPUs" else "right")
    for _, r in df.iterrows():
        pred = r.get("predicted_samples_per_s")
        t.add_row(
            str(r["cores"]),
            r["cpus"],
            "–"
            if pred != pred or pred is None
            else f"{pred:,.1f}{' (extrap.)' if r.get('extrapolated') is True else ''}",
            f"{r['measured_samples_per_s']:,.1f}",
            str(r["measured_workers"]),
            "–"
            if r.get("rate_error_frac") != r.get("rate_error_frac") or r.get("rate_error_frac") is None
            else f"{r['rate_error_frac']:+.1%}",
            _move(r.get("move_frac")),
            _move(r.get("error_after_move_frac"), 1),
            _move(r.get("core_speed_move_frac")),
            "unreachable"
            if r["cores_per_gpu"] is None or r["cores_per_gpu"] != r["cores_per_gpu"]
            else f"{r['cores_per_gpu']:.0f}",
        )
    console.print(t)
    for _, r in df.iterrows():
        console.print(f"cores per GPU from the {r['cores']}-core run: {r['cores_per_gpu_basis']}", highlight=False)


def _print_size_check(console, rows) -> None:
    """``pipeprof size``'s candidates of the masked core counts, each workload's prediction with its interval
    beside what the masked run measured."""
    from rich.table import Table

    if rows.empty:
        console.print("the size table: no workload of the all-cores run has both a step ceiling and a CPU curve")
        return
    t = Table(title="the size table's candidates (one GPU) against the masked runs", title_justify="left")
    heads = (
        "workload",
        "cores",
        "predicted/s (interval)",
        "binding",
        "measured/s",
        "at w",
        "err",
        "in interval",
        "moved",
        "err after",
        "core",
        "worker cores",
        "CPU ms/sample",
    )
    for h in heads:
        t.add_column(h, justify="left" if h in ("workload", "binding") else "right")
    for _, r in rows.iterrows():
        t.add_row(
            r["workload"],
            str(r["cores"]),
            f"{r['predicted_samples_per_s']:,.1f} ({r['predicted_low']:,.1f}–{r['predicted_high']:,.1f})"
            + (" extrap." if r["extrapolated"] else ""),
            r["binding"],
            f"{r['measured_samples_per_s']:,.1f}",
            str(r["measured_workers"]),
            "–" if r["error_frac"] != r["error_frac"] else f"{r['error_frac']:+.1%}",
            {True: "yes", False: "no"}.get(r["within_interval"], "–"),
            _move(r.get("move_frac")),
            _move(r.get("error_after_move_frac"), 1),
            _move(r.get("core_speed_move_frac")),
            _pair(r.get("worker_cores_model"), r.get("worker_cores_got"), 2),
            _pair(r.get("cpu_ms_model"), r.get("cpu_ms_got"), 2),
        )
    console.print(t)
    console.print(
        "moved: the same workload on all cores, at the all-cores run's worker count nearest the mask, in the "
        "bracket run right before the mask, against the all-cores run (the machine's move since); err after: the "
        "prediction's error with that move put in, what the model owns · core: one core's speed at the masked "
        "run's start against the all-cores run's (their CPU references) · worker cores, CPU ms/sample: the "
        "model's → the masked run's; their two ratios multiply to the error (checks.sizing.split): the first is "
        "the model's accounting of cores, the second each sample's CPU moving",
        highlight=False,
    )


def _pair(model, got, digits: int) -> str:
    if model is None or got is None or model != model or got != got:
        return "–"
    return f"{model:.{digits}f} → {got:.{digits}f}"


def _move(frac, digits: int = 0) -> str:
    return "–" if frac is None or frac != frac else f"{frac:+.{digits}%}"


def cmd_merge(args) -> int:
    from pipeprof.orchestrate.merge import merge_runs
    from pipeprof.report.console import render_console

    if len(args.run_dirs) < 2:
        raise ValueError("merge needs the run folders of two or more nodes")
    run = merge_runs(args.run_dirs, args.out_dir)
    render_console(run)
    print(f"merged run folder: {run.path}")
    return 0


def _repeats(args, default: int) -> int:
    """``--repeats`` as given, else the subcommand's own default."""
    return default if args.repeats is None else args.repeats


def _regress(args) -> int:
    from pipeprof.analysis.guard import lines
    from pipeprof.checks.regress import regress

    if not args.config or not args.against:
        raise ValueError("bench regress needs CONFIG and --against RUN_DIR (the base run whose config runs again)")
    found, runs = regress(
        args.config,
        args.against,
        args.overrides,
        args.fail_if_slower / 100,
        # two cycles by default: with one (two runs a side) a machine slower over the middle runs reads as a change
        # that the runs' spread cannot show (docs/ci.md)
        max(1, _repeats(args, 2)),
        args.out_dir,
        log=lambda text: print(text, file=sys.stderr),
    )
    print(runs.to_string(index=False))
    for line in lines(found):
        print(f"guard: {line}")
    return 1 if found.failed else 0


def _bench_gpu_augment(args) -> int:
    """Five tables: the pipeline's per-sample against its batched forms; each step of the batched pipeline alone
    (decode, each op); RandomResizedCrop's resize as a kernel and as roi_align; each decoder alone against the
    anchor; each decoder beside the step, serial and overlapped (the ``gpu_shared`` trial); the rows as CSV in
    --out-dir."""
    from pathlib import Path

    import torch

    from pipeprof.checks.bench import (
        _jpegs,
        beside_the_step,
        decoders_alone,
        gpu_augment,
        ops_alone,
        render_beside,
        render_decoders,
        render_gpu_augment,
        render_ops,
        render_resize,
        resize_forms,
    )

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    if args.batch < 1:
        raise ValueError(f"--batch {args.batch}: gpu-augment decodes batches of at least one JPEG")
    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    repeats = max(10, _repeats(args, 1))
    encoded = _jpegs(args.batch)  # one batch of JPEGs for every table
    forms = gpu_augment(args.preset, args.batch, repeats, device=str(dev), log=log, encoded=encoded)
    ops = ops_alone(args.preset, encoded, dev, repeats)
    resize = resize_forms(encoded, dev, repeats)
    alone = decoders_alone(encoded, dev, repeats, log=log)
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    print(render_gpu_augment(forms) + "\n" + render_ops(ops) + "\n" + render_resize(resize), end="")
    print("\n" + render_decoders(alone, name), end="")
    beside = beside_the_step(encoded, dev, args.preset, args.model, args.precision, log=log) if args.model else None
    if beside is not None:
        print("\n" + render_beside(beside), end="")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, df in (("forms", forms), ("ops", ops), ("resize", resize), ("decoders", alone), ("beside", beside)):
        if df is not None:
            df.drop(columns=[c for c in df if df[c].map(type).eq(list).any()]).to_csv(
                out / f"gpu_augment_{name}.csv", index=False
            )
    return 0


def cmd_bench(args) -> int:
    from pipeprof.checks.bench import render_repeat, render_sweep_speed, repeat, soak, sweep_speed

    if args.which == "soak":
        soak(args.minutes, args.config, log=lambda text: print(text, flush=True))
        return 0
    if args.which == "gpu-augment":
        return _bench_gpu_augment(args)
    if args.which == "watch-overhead":
        from pipeprof.checks.watch_overhead import PROGRESS, render_watch_overhead, watch_overhead

        print(
            render_watch_overhead(
                watch_overhead(
                    args.config,
                    args.script_args,
                    args.steps,
                    max(_repeats(args, 2), 2),
                    args.out_dir,
                    args.progress or PROGRESS,
                    log=lambda text: print(text, file=sys.stderr),
                )
            ),
            end="",
        )
        return 0
    if args.which == "regress":
        return _regress(args)
    if args.which == "action-trials":
        from pipeprof.checks.action_known import bench_action_trials, render_action_trials

        print(
            render_action_trials(
                bench_action_trials(
                    args.workers, args.pairs, max(_repeats(args, 1), 1), log=lambda text: print(text, file=sys.stderr)
                )
            ),
            end="",
        )
        return 0
    if args.which == "repeat":
        print(
            render_repeat(
                repeat(
                    args.config, args.overrides, args.times, args.out_dir, log=lambda text: print(text, file=sys.stderr)
                )
            ),
            end="",
        )
        return 0
    df = sweep_speed(
        args.config, args.overrides, _repeats(args, 1), args.out_dir, log=lambda text: print(text, file=sys.stderr)
    )
    print(render_sweep_speed(df), end="")
    return 0


def cmd_watch(args) -> int:
    from pipeprof.watch.session import Options, Session

    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        raise ValueError("no command to watch: pipeprof watch [options] -- COMMAND ARGS...")
    if args.seconds is not None and args.steps is not None:
        raise ValueError("--seconds and --steps: give one window, not both")
    if args.tune_max_s <= 0:
        raise ValueError(f"--tune-max-s must be a positive number of seconds, not {args.tune_max_s:g}")
    sink = open(args.log, "a", buffering=1) if args.log else None  # noqa: SIM115 - open for the whole watch
    log = (lambda text: print(text, file=sink)) if sink else (lambda text: print(text, file=sys.stderr, flush=True))
    seconds = 30.0 if args.tune and args.seconds is None and args.steps is None else args.seconds
    try:
        return Session(
            Options(
                command,
                seconds,
                args.steps,
                args.tune,
                args.stop,
                args.out_dir,
                args.window_s,
                args.live_s,
                log,
                args.redraws,
                args.tune_max_s,
            )
        ).execute()
    finally:
        if sink:
            sink.close()


def cmd_pack(args) -> int:
    from pipeprof.data.sources.shards import pack_folder

    try:
        info = pack_folder(args.src, args.dst, shard_size_mb=args.shard_size, seed=args.seed, overwrite=args.overwrite)
    except OSError as exc:  # SourceError (missing/empty folder), FileExistsError (shards already there)
        hint = " (--overwrite replaces them)" if isinstance(exc, FileExistsError) else ""
        print(f"pipeprof pack: {exc}{hint}", file=sys.stderr)
        return 2
    print(
        f"packed {info['samples']} samples into {info['shards']} shards, {info['total_mb']:.1f} MB in all, "
        f"in {args.dst}"
    )
    for skipped in info["skipped"]:  # not regular files (a FIFO, a directory named x.jpg): never opened
        print(f"  skipped: {skipped}")
    return 0


def cmd_check_data(args) -> int:
    """Exit 0 when every file checked reads, 1 when some do not, 2 when the folder is missing or empty."""
    from pipeprof.data.check import check_paths, dataset_paths

    try:
        paths = dataset_paths(args.dir)
    except OSError as exc:  # SourceError: missing or empty folder, bad file list
        print(f"pipeprof check-data: {exc}", file=sys.stderr)
        return 2
    found = check_paths(paths, args.limit, int(args.max_pixels))
    print("\n".join(found.lines()))
    return 1 if found.unreadable else 0


def _counts(text: str, flag: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes whole numbers separated by commas, not {text!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"{flag} takes whole numbers of at least 1, not {text!r}")
    return counts


def cmd_size(args) -> int:
    from pathlib import Path

    import yaml

    from pipeprof.analysis import workstation as ws
    from pipeprof.report.workstation import render_pairs, render_size

    from .results import load_measured

    target = ws.DEFAULT_TARGET if args.target is None else args.target
    if not 0 < target <= 1:
        raise ValueError(f"--target is a share of the GPUs' ceiling, above 0 and at most 1, not {target:g}")
    if args.machines:
        candidates = ws.parse_machines(yaml.safe_load(Path(args.machines).read_text()))
    else:
        cores = _counts(args.cores, "--cores") if args.cores else list(ws.DEFAULT_CORES)
        candidates = ws.grid(cores, _counts(args.gpus, "--gpus"))
    runs = [load_measured(d) for d in args.run_dirs]
    workloads = [w for r in runs for w in ws.workloads(r)]
    if not workloads:
        groups = [a for r in runs for a in r.meta.get("analysis", {}).get("groups", [])]
        skipped = sorted({a.cpu_figures_skipped for a in groups if a.cpu_figures_skipped})
        if any(not a.cpu_figures_skipped for a in groups) or not groups:
            skipped.append("no gpu_ceiling trial and CPU curve (cpu_pipeline at 2+ worker counts) of one GPU")
        why = "; ".join(skipped)
        raise ValueError(f"no workload to size in {', '.join(args.run_dirs)}: {why}")
    rows = ws.table(workloads, candidates)
    print(render_size(rows, ws.cheapest(rows, target), target), end="")
    for r in runs:  # where a run measured masked pairs (trials: cores_pair), the model against them
        pairs = render_pairs(ws.masked_pairs(r))
        print(f"\n{r.path.name}: {pairs}" if pairs else "", end="")
    return 0


COMMANDS = {
    "check-data": cmd_check_data,
    "size": cmd_size,
    "run": cmd_run,
    "pack": cmd_pack,
    "validate": cmd_validate,
    "doctor": cmd_doctor,
    "make-dataset": cmd_make_dataset,
    "report": cmd_report,
    "compare": cmd_compare,
    "bench": cmd_bench,
    "merge": cmd_merge,
    "watch": cmd_watch,
}


def _input_errors() -> tuple:
    """The exceptions that mean bad input (exit 2). Imported when one is raised: ``results`` imports pandas,
    which ``--help`` and the commands that never read a run folder do without."""
    from .config import ConfigError
    from .results import DiskFull

    return ConfigError, ValueError, FileNotFoundError, DiskFull


#: the commands that run trials outside ``orchestrate.runner.execute`` (which gives its own process's CUDA streams
#: queues of their own, ``env.spread_gpu_streams``): the same, before their first CUDA call
TRIAL_COMMANDS = ("bench",)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command in TRIAL_COMMANDS:
        from pipeprof.env import spread_gpu_streams

        spread_gpu_streams()  # before any CUDA call of this process (its trials' streams; see there)
    try:
        return COMMANDS[args.command](args)
    except Exception as exc:
        if not isinstance(exc, _input_errors()):
            raise
        print(f"pipeprof {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
