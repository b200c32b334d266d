"""What ``pipeprof watch`` prints: the live line every few seconds and the closing summary.

Both go to pipeprof's own stream (stderr, or ``--log FILE``), never the user's stdout. The live line
is per loader over the last interval: samples/s (all ranks together), the data-wait share, the GPUs'
utilisation from the monitor and the loader's workers' CPU. The summary prints what run.json stores:
each loader's verdict and basis per rank (the analysis' words), the slowest rank, the pause and its
recommendation, and the run folder.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Optional

from pipeprof.answer import CoresNeeded
from pipeprof.stats import signed_pct, workers_text

if TYPE_CHECKING:  # pandas is slow to import: the watch imports it after the job has started
    import pandas as pd


def _pct(x: Optional[float]) -> str:
    return "–" if x is None or x != x else f"{x:.0%}"


def _rate(x: Optional[float]) -> str:
    return "–" if x is None or x != x else f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def line(session, since: float, now: float) -> list[str]:
    """One line per loader that returned batches since ``since``."""
    store, out = session.store, []
    from pipeprof.measure.monitors import gpu_mean

    gpu = gpu_mean(session.monitor.timeline(since), "util_pct") if session.monitor else None
    for label in store.loaders:
        recent = [
            b
            for (cid, lab), bs in store.batches.items()
            if lab == label  # in order: search, not scan
            for b in bs[bisect.bisect_left(bs, since, key=lambda x: x.t_ret) :]
        ]
        if not recent:
            continue
        span = now - since
        samples = sum(b.samples or 0 for b in recent)
        wait = sum(b.t_ret - max(b.t_call, since) for b in recent) / span / store.ranks(label)
        workers = {p for (cid, lab), s in store.workers.items() if lab == label for p in s}
        cpu = session.procs.mean_pct(workers, [(since, now)]) if workers else None
        # the loader's own count on each rank: the PIDs seen grow each pass where workers are not persistent
        count = (store.loaders[label].get("settings", {}).get("num_workers") or 0) * store.ranks(label)
        out.append(
            f"pipeprof watch {now - session.t_start:5.0f}s  {label}: {_rate(samples / span)} samples/s, "
            f"data wait {_pct(wait)}, GPU {'–' if gpu is None else f'{gpu:.0f}%'}, workers' CPU "
            f"{'–' if cpu is None else f'{cpu:.0f}%'} ({workers_text(count)})"
        )
    return out


def summary(run, tune: Optional[dict]) -> list[str]:
    """The closing lines, read from the stored run."""
    meta, lines = run.meta, []
    lines.append(
        f"pipeprof watch: {meta.get('status')} ({meta.get('ended_by')}), "
        f"{(meta.get('window') or {}).get('watched_s') or 0:.1f} s watched; device "
        f"{(meta.get('config') or {}).get('device')}"
    )
    for exc in meta.get("exceptions", []):
        lines.append(f"  the job raised {exc['type']}: {exc['message']} (rank {exc.get('rank')}, {exc.get('where')})")
    if run.trials.empty:
        lines += untimed_lines(meta.get("loaders") or {})
    verdicts = {v["trial_id"]: v for v in (meta.get("analysis") or {}).get("verdicts", [])}
    for _, r in run.trials[run.trials["kind"] == "end_to_end"].iterrows() if len(run.trials) else ():
        lines += _row_lines(r, verdicts.get(r["trial_id"], {}))
    for label, info in (meta.get("analysis") or {}).get("loaders", {}).items():
        if info.get("slowest_rank"):
            lines.append(f"  {label}: slowest rank {info['slowest_rank']['rank']}: {info['slowest_rank']['why']}")
    lines += tune_lines(tune)
    return lines + [f"run folder: {run.path}"]


def untimed_lines(loaders: dict) -> list[str]:
    """Why nothing could be timed: no loader was built, or each one built (``loaders``: run.json's records)
    handed out no batch through the base iterator whose ``__next__`` pipeprof times."""
    if not loaders:
        return ["  no DataLoader was built in any process of the job: nothing to say about its input"]
    lines = []
    for label, info in loaders.items():
        s = info.get("settings") or {}
        what = f"{s.get('loader_class') or 'DataLoader'} built at {info.get('path') or label}:{info.get('line') or ''}"
        if s.get("own_iter"):
            why = (
                "its class defines its own __iter__, whose batches did not pass through the DataLoader iterator "
                "pipeprof times; iterate a plain DataLoader (or return super().__iter__()) to have it timed"
            )
        else:
            why = "it handed out no batch while the job was watched"
        lines.append(f"  {label}: {what.rstrip(':')}: no batch timed: {why}")
    return lines


def _row_lines(r: pd.Series, v: dict) -> list[str]:
    head = f"  {r['loader']} rank {r['rank']} ({workers_text(r['num_workers'])}, batch {r['batch_size']}, {r['mode']})"
    if r["status"] != "ok":
        return [f"{head}: {r.get('error')}"]
    low, high = r.get("samples_per_s_ci95_low"), r.get("samples_per_s_ci95_high")
    ci = f" ({_rate(low)}–{_rate(high)})" if low is not None and low == low else ""
    gpu, cpu = r.get("gpu_util_pct_mean"), r.get("workers_cpu_pct_mean")
    cpu = None if not r["num_workers"] else cpu  # no workers: the loop loads in its own process
    return [
        f"{head}: {_rate(r['samples_per_s'])}{ci} samples/s, data wait {_pct(r['data_wait_frac'])}, "
        f"GPU {'–' if gpu is None or gpu != gpu else f'{gpu:.0f}%'}, workers' CPU "
        f"{'–' if cpu is None or cpu != cpu else f'{cpu:.0f}%'}",
        f"    verdict: {v.get('verdict', 'unknown')}: {v.get('verdict_basis', 'no verdict stored')}",
    ]


def tune_lines(tune: Optional[dict]) -> list[str]:
    """The pause's lines (``tune``: ``tune.recommend``'s result, with the pause's facts)."""
    if not tune:
        return []
    if tune.get("error"):
        return [f"  tune: {tune['error']}"]
    from .tune import picked  # pandas: the watch imports it after the job has started

    points = ", ".join(
        f"{p['num_workers']} w {_rate(p['loader_alone_samples_per_s'])}/s" for p in tune.get("predicted", [])
    )
    at = tune.get("step_at_threads") or {}
    at = (
        f", at {at['threads']} intra-op thread{'' if at['threads'] == 1 else 's'} "
        + (
            f"{_rate(at['samples_per_s'])} (the loop's {at['steps']} steps after the pause)"
            if at.get("steps")
            else at.get("error", "")
        )
        if at
        else ""
    )
    out = [
        f"  tune ({tune['loader']}, paused {tune['paused_s']:.1f} s): the loader alone at {points}; the step "
        f"alone {_rate(tune.get('step_samples_per_s'))} samples/s{at}"
    ]
    pick = picked(tune)
    check = tune.get("own_count_check") or {}
    if pick is not None and check.get("disagrees"):  # a model that misses the job there: its figure is withheld
        out.append(
            f"  → num_workers={pick.workers} (no predicted rate: the model misses the job by "
            f"{abs(check['error_frac']):.0%} at its own count ({check['num_workers']}), predicting "
            f"{_rate(check['predicted_samples_per_s'])} against the {_rate(check['watched_samples_per_s'])} watched)"
        )
    elif pick is not None:
        out.append(
            f"  → num_workers={pick.workers} (predicted {_rate(pick.samples_per_s)} samples/s"
            f"{_cores_text(CoresNeeded.from_dict(tune.get('cores_needed')))})"
        )
        if tune.get("change"):
            out.append(f"    {tune['change']}")
        if tune.get("threads_line"):
            out.append(f"    {tune['threads_line']}")
        out += _pass_start_line(tune, pick.workers)
    if (tune.get("local_ranks") or 1) > 1:
        out.append(
            f"    {tune['local_ranks']} ranks of the job share this machine: each predicted on its share, "
            f"{tune['cores_per_rank']:.3g} core{'' if tune['cores_per_rank'] == 1 else 's'}, the others' load absent "
            "from the pause"
        )
    if check.get("disagrees") and pick is None:
        out.append(
            f"    note: at the loop's own count ({check['num_workers']}) the model predicts "
            f"{_rate(check['predicted_samples_per_s'])} against the {_rate(check['watched_samples_per_s'])} watched "
            f"({signed_pct(check['error_frac'])}): its other counts' predictions may be off by as much"
        )
    if tune.get("curve_note"):
        out.append(f"    note: {tune['curve_note']}")
    return out + action_lines(tune)


def _pass_start_line(tune: dict, workers: int) -> list[str]:
    """Where the start of each pass (``tune.in_passes``) costs the loop a share of its time at the pick: the
    prediction holds it, and a reader should know why it is below both the step and the loader alone."""
    at = next((p for p in tune.get("predicted", []) if p["num_workers"] == workers), {})
    start, n, step = at.get("pass_start_s"), at.get("samples_per_pass"), tune.get("step_samples_per_s")
    if not (start and n and step):
        return []
    share = start / (start + n / step)
    if share < 0.02:
        return []
    return [
        f"    each pass ({n:,.0f} samples) begins with {start * 1e3:,.0f} ms before its first batch (workers started, "
        f"the first batch made), in which the step waits: {share:.0%} of a pass at the step's rate, in the prediction"
    ]


def action_lines(tune: dict) -> list[str]:
    """The actions the pause tried at the recommended count (loader gain and its interval, the end-to-end gain
    it predicts against the watched step), those it did not with why, and the best one's code to write."""
    if tune.get("actions_error"):
        return [f"  actions: the pause could not read the loader's dataset ({tune['actions_error']})"]
    listed = tune.get("actions") or []
    if not listed:
        return []
    read = [a for a in listed if a.get("measured") and a.get("ci_level")]
    together = (
        f"; intervals at {100 * read[0]['ci_level']:.3g}%, holding for the {len(read)} together"
        if len(read) > 1
        else ""
    )
    out = [
        f"  actions at num_workers={tune.get('actions_at_workers')} (each alone, your loader measured before and "
        f"after them; end to end: the step with each change's GPU time added, its host time not modelled"
        f"{together}):"
    ]
    folded: dict[str, list[dict]] = {}  # a reason said once for the changes it holds back
    for a in listed:
        if a.get("measured") and a.get("action_gain_ci95_low") is not None:
            out.append(
                f"    {a['action']}: loader alone {a['action_gain_frac']:+.1%} ({a['action_gain_ci95_low']:+.1%} … "
                f"{a['action_gain_ci95_high']:+.1%}){' verified' if a.get('verified') else ', not shown to help'}; "
                f"end to end {a['predicted_e2e_gain_frac']:+.1%} ({a['predicted_e2e_gain_ci95_low']:+.1%} … "
                f"{a['predicted_e2e_gain_ci95_high']:+.1%}) predicted against the step"
            )
        else:
            why = a.get("why_not") or a.get("skipped") or a.get("error") or a.get("unstable_reason") or "no pair ran"
            folded.setdefault(why, []).append(a)
    for why, held in folded.items():
        if len(held) == 1:
            out.append(f"    {held[0]['action']}: not tried: {why}")
        else:
            names = ", ".join(a.get("id") or a["action"] for a in held)
            out.append(f"    {len(held)} changes not tried ({names}): {why}")
    best = next((a for a in listed if a.get("id") == tune.get("best_action")), None)
    if best is None:
        # an interval that straddles no gain names both readings: the likeliest change, and that it may not help
        near = max((a for a in listed if a.get("measured")), key=lambda a: a["predicted_e2e_gain_frac"], default=None)
        if near is None or near["predicted_e2e_gain_frac"] <= 0:
            return out + ["  → no action tried was shown to help"]
        return out + [
            f"  → no action tried was shown to help; the likeliest: {near['action']}, end to end "
            f"{near['predicted_e2e_gain_frac']:+.1%} ({near['predicted_e2e_gain_ci95_low']:+.1%} … "
            f"{near['predicted_e2e_gain_ci95_high']:+.1%}): it may help by that much, or not at all"
        ]
    out.append(
        f"  → best measured change: {best['action']}, end to end {best['predicted_e2e_gain_frac']:+.1%} "
        f"({best['predicted_e2e_gain_ci95_low']:+.1%} … {best['predicted_e2e_gain_ci95_high']:+.1%}); what to write:"
    )
    out += [f"      {line}" for line in (best.get("snippet") or "").splitlines()]
    ties = [a for a in listed if a.get("id") in (tune.get("best_as_good") or [])]
    if ties:
        words = "; ".join(
            f"{a['action']}, end to end {a['predicted_e2e_gain_frac']:+.1%} ({a['predicted_e2e_gain_ci95_low']:+.1%} "
            f"… {a['predicted_e2e_gain_ci95_high']:+.1%})"
            for a in ties
        )
        out.append(f"  → as good within the intervals (not separable from it): {words}")
    return out


def _cores_text(need: Optional[CoresNeeded]) -> str:
    """The cores the step needs, said with what it rests on: past the counts the pause measured it is an
    extrapolation, and the pause does not measure the loader's hand-off limit, which may stop it sooner."""
    if need is not None and need.cores is None and need.handoff_limit:
        return f"; no core count keeps the step fed: the hand-off (measured) passes at most {need.handoff_limit:,.0f}/s"
    if need is None or not need.cores:
        return ""
    past = ", extrapolated past the counts the pause measured" if need.extrapolated else ""
    if need.handoff_limit is None or need.handoff_limit == float("inf"):
        return f"; about {need.cores} cores keep the step fed{past}, if the hand-off (not measured) allows"
    short = ", but the hand-off may stop it short" if need.handoff_straddles else ""
    return f"; about {need.cores} cores keep the step fed{past} (hand-off measured: {need.handoff_limit:,.0f}/s{short})"
