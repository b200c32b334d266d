"""The commands that check pipeprof's own claims or size a machine from runs: ``validate`` (workloads of known
answer, and ``--sizing``: the core-count predictions inside CPU masks), ``bench`` (figures of pipeprof itself) and
``size`` (what each candidate machine delivers for measured runs). Each takes the parsed arguments and returns the
exit status; the tables they print are rendered here, from the checks' own frames.
"""

from __future__ import annotations

import sys


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
    if args.which == "offload-check":
        from pipeprof.checks.offload_check import check, render

        log = lambda text: print(text, file=sys.stderr)  # noqa: E731
        print(render(check(f"{args.out_dir}/offload", overrides=args.overrides, progress=log)), end="")
        return 0
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
    if args.offload:  # remote CPUs for the pipeline: a DataLoader run and a Ray run (analysis.offload)
        from pipeprof.analysis import offload
        from pipeprof.report.offload import render_offload

        if args.machines or args.cores:
            raise ValueError("--offload sizes remote cores for --gpus: --machines and --cores are the workstation's")
        runs, gpus = [load_measured(d) for d in args.run_dirs], _counts(args.gpus or "1,2,4,8", "--gpus")
        x, rows = offload.size(runs, gpus, target, args.link_gbps, args.node_cores)
        print(render_offload(x, rows, target, args.link_gbps, args.node_cores), end="")
        return 0
    if args.machines:
        candidates = ws.parse_machines(yaml.safe_load(Path(args.machines).read_text()))
    else:
        cores = _counts(args.cores, "--cores") if args.cores else list(ws.DEFAULT_CORES)
        candidates = ws.grid(cores, _counts(args.gpus or "1", "--gpus"))
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
