"""``pipeprof`` command line: a thin dispatcher onto the Python API. The arguments are ``cli_args``'s; the
commands that check pipeprof's claims or size machines (validate, bench, size) are ``cli_checks``'s.

Exit status: 0 done, 1 a run without an answer (every trial of a kind the answer needs failed: status
'failed: <cause>'), 2 bad input (config, arguments, missing folder, a run folder that cannot be resumed)
before anything ran, 130 / 143 a run stopped by SIGINT
(Ctrl-C) / SIGTERM (128 + the signal's number, as a shell reports a process the signal killed).
"""

from __future__ import annotations

import json
import os
import signal
import sys

from .cli_args import build_parser
from .cli_checks import cmd_bench, cmd_size, cmd_validate


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


def cmd_merge(args) -> int:
    from pipeprof.orchestrate.merge import merge_runs
    from pipeprof.report.console import render_console

    if len(args.run_dirs) < 2:
        raise ValueError("merge needs the run folders of two or more nodes")
    run = merge_runs(args.run_dirs, args.out_dir)
    render_console(run)
    print(f"merged run folder: {run.path}")
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
    args = build_parser().parse_args(argv)
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
