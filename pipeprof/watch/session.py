"""``pipeprof watch -- COMMAND``: the parent that starts the job, listens, monitors and writes the run.

The command runs as a child, unchanged: stdin, stdout and stderr are the user's own (pipeprof prints
on stderr or ``--log``), and pipeprof exits with the job's status (128 + N when a signal N ended it,
as a shell reports). The child's environment gains ``boot/`` first on ``PYTHONPATH`` (the hook in
every Python process of the job: torchrun's ranks too) and the channel's socket.

The watched window starts at the job's first batch and ends after ``--seconds`` or ``--steps``
(batches of the training loop's loader, rank 0), at Ctrl-C/SIGTERM, or when the job exits. Then:
``--tune`` pauses the training process at its next step boundary and measures its loader alone at a
few worker counts, its hand-off, and the actions that apply to its dataset and loader (``tune``); the
hooks are switched off (the loop runs untouched from there); the monitor stops; the run folder is
written (``folder``, ``answer``) and the summary printed; with ``--stop`` the job is sent SIGINT (then
SIGTERM, then SIGKILL, 10 s apart), else it runs on and the parent waits for it, then records its exit
status in run.json.

Signals: Ctrl-C reaches the job directly (same process group); pipeprof ends the window, writes the
run and waits for the job. A second SIGINT is passed to the job, a third kills it; SIGTERM is passed on.
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from pipeprof.stats import pooled_rate_ci95

from . import channel, live
from .procs import ProcTable
from .records import Store, step_rates, summarize_rates, warmup_batches, windows

BOOT = Path(__file__).resolve().parent / "boot"
ROOT = Path(__file__).resolve().parents[2]
clock = time.perf_counter


def tuning_module():
    """``watch.tune``, imported when a pause runs (it imports pandas and torch: slow, and a plain watch needs
    neither)."""
    from . import tune

    return tune


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@dataclass
class Options:
    command: list[str]
    seconds: Optional[float] = None
    steps: Optional[int] = None
    tune: bool = False
    stop: bool = False
    out_dir: str = "out"
    window_s: float = 0.75  # steady-state windows (measure.window_s): the watch's and the pause's
    live_s: float = 5.0
    log: Callable[[str], None] = field(default=_stderr)
    redraws: int = 60  # re-draws of the windows for the answer's confidence (measure.redraws)
    tune_max_s: float = 120.0  # the whole pause's budget: the curve, the hand-off and the actions


def child_env(socket_path: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env[channel.ENV_SOCKET], env[channel.ENV_ROOT] = socket_path, str(ROOT)
    return env


def machine() -> dict:
    """The machine as run.json records it, without ``env.snapshot``'s library versions: importing every
    optional library takes seconds, and the job's own torch version comes with its processes' hello."""
    import platform
    import socket

    from pipeprof import env

    out = {"hostname": socket.gethostname(), "platform": platform.platform()}
    for name, fn in (
        ("cpu_model", env.cpu_model),
        ("cores", env.usable_cores),
        ("cpu_groups", env.cpu_groups),
        ("memory", env.memory_info),
        ("gpus", env.gpu_info),
    ):
        try:
            out[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a missing fact is recorded as missing, the run goes on
            out[name] = f"unknown ({type(exc).__name__})"
    return out


def exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class Session:
    """One watch: the child, the channel, the monitor, the window, the run folder."""

    def __init__(self, opts: Options):
        self.o, self.store, self.procs = opts, Store(), ProcTable()
        self.server = self.child = self.monitor = self.run = None
        self.timeline = None
        self.t_start, self.started = clock(), time.time()
        self.t_end: Optional[float] = None
        self.finished, self.ended_by, self.exit_status = False, None, None
        self.t_popen, self.job_wall_s = clock(), None
        self.signals: list[int] = []
        self.tuned: Optional[str] = None
        self.tune_result: Optional[dict] = None
        self.ci_target = 0.05
        self._tracked: set = set()
        self._last_tick = self._last_live = clock()
        self._tune_seen = 0
        self._stopping: Optional[tuple[float, int]] = None  # (when, signals sent) for --stop

    # -- the whole watch ----------------------------------------------------------------------------
    def execute(self) -> int:
        from pipeprof.results import check_out_dir

        check_out_dir(self.o.out_dir)  # before the job starts, as `run` checks it before measuring
        tmp = tempfile.mkdtemp(prefix="pipeprof-watch-")
        previous = self._install_signals()
        try:
            self.server = channel.Server(tmp)
            try:
                self.t_popen = clock()
                self.child = subprocess.Popen(self.o.command, env=child_env(self.server.path))
                self._waiter = threading.Thread(target=self._wait_child, name="pipeprof-watch-wait", daemon=True)
                self._waiter.start()
            except OSError as exc:
                self.o.log(f"pipeprof watch: cannot run {self.o.command[0]}: {exc.strerror or exc}")
                return 127
            from pipeprof.measure.monitors import Monitor  # after the child starts: pandas takes a while

            self.monitor = Monitor(hz=5).start()
            self.monitor.set_trial("watch")
            if self.o.tune:  # the pause's search imports torch (slow): while the job starts, not after the window
                from . import tune  # noqa: F401
            try:
                return self._loop()
            except Exception as exc:  # a fault of ours: the job runs on, unwatched, and its status still passes
                if os.environ.get("PIPEPROF_DEBUG"):
                    import traceback

                    traceback.print_exc()
                self.o.log(f"pipeprof watch: stopped watching ({type(exc).__name__}: {exc}); the job runs on")
                for cid in list(self.server.conns):
                    self.server.send(cid, {"cmd": "resume"})
                    self.server.send(cid, {"cmd": "off"})
                return exit_code(self.child.wait())
        finally:
            if self.monitor is not None:
                self.monitor.stop()
            if self.server is not None:
                self.server.close()
            shutil.rmtree(tmp, ignore_errors=True)
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _loop(self) -> int:
        while self.child.poll() is None:
            self.pump(0.1)
            if not self.finished and (self.signals or self._window_over()):
                self.close_window(signal.Signals(self.signals[0]).name if self.signals else "window")
            self._escalate_stop()
        self._waiter.join()  # it has the exit time
        self.exit_status = exit_code(self.child.returncode)
        self._drain_after_exit()
        if not self.finished:
            self.close_window("command exited")
        elif self.run is not None:
            self.run.meta |= {
                "exit_status": self.exit_status,
                "job_wall_s": self.job_wall_s,
                "exceptions": self.store.exceptions,
            }  # one raised after the window, too
            self.run.save_meta()
        return self.exit_status

    def _wait_child(self) -> None:
        """The job's exit time to the millisecond (the loop polls every 0.1 s): its wall time, Popen to exit."""
        self.child.wait()
        self.job_wall_s = clock() - self.t_popen

    def _drain_after_exit(self) -> None:
        """The job's last messages (its end, an exception) may still be on their way: up to 2 s."""
        deadline = clock() + 2.0
        while clock() < deadline and set(self.server.conns) - self.store.closed:
            self.pump(0.05)
        self.pump(0.0)

    # -- listening ----------------------------------------------------------------------------------
    def pump(self, wait: float) -> None:
        """Take what the job sent (waiting up to ``wait`` for the first message); tick the per-process CPU,
        the monitor's set of job processes and the live line."""
        got = []
        try:
            got.append(self.server.inbox.get(timeout=wait) if wait > 0 else self.server.inbox.get_nowait())
        except queue.Empty:
            pass
        for cid, msg in got + self.server.drain():
            try:
                self.store.add(cid, msg)
            except (KeyError, TypeError, ValueError):  # a message we cannot read is dropped, never the watch
                continue
        now = clock()
        if now - self._last_tick >= 0.5:
            self._last_tick = now
            pids = self.store.pids()
            self.procs.tick(pids, now, self.store.parents())
            if pids != self._tracked and self.monitor is not None and not self.finished:
                self.monitor.track_workers(pids)
                self._tracked = pids
        if self.t_end is None and now - self._last_live >= self.o.live_s:  # quiet once the window is over
            for text in live.line(self, self._last_live, now):
                self.o.log(text)
            self._last_live = now

    def _window_over(self) -> bool:
        if self.o.seconds is not None:
            t0 = self.store.first_batch_t()
            if t0 is not None and clock() >= t0 + self.o.seconds:
                self.t_end = t0 + self.o.seconds
                return True
        if self.o.steps is not None:
            key = self.store.main_loader()
            if key is not None and len(self.store.batches[key]) >= self.o.steps:
                self.t_end = self.store.batches[key][self.o.steps - 1].t_ret
                return True
        return False

    def watched_s(self) -> float:
        t0 = self.store.first_batch_t()
        return 0.0 if t0 is None else max(0.0, (self.t_end or clock()) - t0)

    def device(self) -> str:
        return "cuda" if any(b.gpu_s is not None for bs in self.store.batches.values() for b in bs) else "cpu"

    # -- the end of the window ----------------------------------------------------------------------
    def close_window(self, reason: str) -> None:
        self.ended_by = reason
        self.t_end = self.t_end or clock()
        alive = self.child.poll() is None
        if reason == "window" and self.o.tune and alive:
            self.tune()
        for cid in list(self.server.conns):
            self.server.send(cid, {"cmd": "off"})
        self.monitor.set_trial(None)
        self.monitor.stop()
        self.timeline = self.monitor.timeline()
        self.finished = True
        try:
            self.run = self.finish(self._status(reason))
        except Exception as exc:  # noqa: BLE001 - the job's exit status must pass through whatever we hit
            self.run = self._finish_elsewhere(reason, exc)
        if self.o.stop and self.child.poll() is None:
            self._stopping = (clock(), 0)

    def _finish_elsewhere(self, reason: str, exc: Exception):
        """The out_dir failed after the job ran (it was writable at the start): what was measured goes to a
        fresh folder under the system's temp dir instead, and the log says where; never dropped."""
        first = f"{type(exc).__name__}: {exc}"
        self.o.out_dir = tempfile.mkdtemp(prefix="pipeprof-watch-kept-")
        try:
            run = self.finish(self._status(reason))
        except Exception as again:  # noqa: BLE001 - the job's exit status must pass through whatever we hit
            self.o.log(
                f"pipeprof watch: the run folder could not be written ({first}), nor under "
                f"{self.o.out_dir}: {type(again).__name__}: {again}"
            )
            return None
        self.o.log(f"pipeprof watch: the run folder could not be written ({first}); what was measured is in {run.path}")
        return run

    def _status(self, reason: str) -> str:
        if reason in ("SIGINT", "SIGTERM"):
            return "interrupted"
        if reason == "window":
            return "complete"
        windowed = self.o.seconds is not None or self.o.steps is not None
        return "ended_early" if windowed or self.exit_status else "complete"

    def finish(self, status: str):
        """Rows, the analysis, the run folder, report.html and the summary."""
        from pipeprof.env import usable_cores

        from .answer import analyse_loaders
        from .folder import build_rows, write

        rows = build_rows(self)
        run = write(self, status, {}, rows, machine())  # what was measured is on disk before any analysis runs
        try:
            cores = usable_cores()["usable"]
            if self.tuned:  # on the share of the cores the pause used
                self.tune_result |= self._recommend(rows, self.tune_result.get("cores_per_rank") or cores)
            run.meta |= {
                "analysis": analyse_loaders(rows, cores, self.device(), self.o.redraws) if rows else {},
                "tune": self.tune_result,
            }
        except Exception as exc:  # noqa: BLE001 - the rows stay, with the reason there is no answer beside them
            run.meta["analysis_error"] = f"{type(exc).__name__}: {exc}"
            run.save_meta()
            self.o.log(
                f"pipeprof watch: the analysis failed ({run.meta['analysis_error']}): the measured rows are in "
                f"{run.path}"
            )
            return run
        run.save_meta()
        self._report(run)
        for text in live.summary(run, self.tune_result):
            self.o.log(text)
        return run

    def _report(self, run) -> None:
        """report.html when the renderer can draw this run; else the console summary stands alone."""
        try:
            from pipeprof.report.html import write_report

            from .page import with_watch_section

            write_report(run)
            with_watch_section(run, self.tune_result)
        except Exception as exc:  # noqa: BLE001 - the run folder is whole without the page
            run.meta["report_error"] = f"{type(exc).__name__}: {exc}"
            run.save_meta()
            (run.path / "report.html").unlink(missing_ok=True)

    # -- stopping the job ---------------------------------------------------------------------------
    def _escalate_stop(self) -> None:
        """--stop: SIGINT, then SIGTERM and SIGKILL 10 s apart while the job is still running."""
        if self._stopping is None or self.child.poll() is not None:
            return
        since, sent = self._stopping
        if sent < 3 and (sent == 0 or clock() - since >= 10.0):
            self.child.send_signal((signal.SIGINT, signal.SIGTERM, signal.SIGKILL)[sent])
            self._stopping = (clock(), sent + 1)

    def _install_signals(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in previous:
            signal.signal(s, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame) -> None:
        self.signals.append(signum)
        if self.child is None or self.child.poll() is not None:
            return
        if signum == signal.SIGTERM:
            self.child.send_signal(signal.SIGTERM)
        elif self.signals.count(signal.SIGINT) == 2:  # the job got the terminal's Ctrl-C; pass a second
            self.child.send_signal(signal.SIGINT)
        elif self.signals.count(signal.SIGINT) >= 3:
            self.child.kill()

    # -- --tune ---------------------------------------------------------------------------------------
    def _step_rate(self, key) -> Optional[float]:
        return self._step_stats(key)["samples_per_s"]  # the median, as records.step_row reads the stored step row

    def _step_stats(self, key) -> dict:
        """The watched step's rate over the loader's windows: median and 95% interval (``summarize_rates``)."""
        loader = self.store.loaders[key[1]].get("settings", {})
        batches = [b for b in self.store.batches[key] if b.t_ret <= self.t_end]
        wins = windows(
            batches,
            self.o.window_s,
            loader.get("num_workers") or 1,
            warmup_batches(loader),
            loader.get("batch_size") or 1,
            self.t_end,
        )
        return summarize_rates(step_rates(wins))

    def _ask(self, cid: int, cmd: dict, kind: str, timeout: float) -> dict:
        """A pause command's answer (its message of ``kind``), asked once more where it failed
        (``tune.once_more``); ``{"error": NO_ANSWER}`` where the process did not answer in ``timeout``."""
        tuning = tuning_module()

        def ask() -> dict:
            self.server.send(cid, cmd)
            got = self._await(cid, {kind}, timeout) or {"error": tuning.NO_ANSWER}
            if got.get("error"):
                self.o.log(f"pipeprof watch:   {cmd['cmd']} at {cmd['workers']} workers failed: {got['error']}")
            return got

        return tuning.once_more(ask)

    def _await(self, cid: int, kinds: set, timeout: float) -> Optional[dict]:
        """The next pause message of ``kinds`` from ``cid``, pumping the channel meanwhile."""
        deadline = clock() + timeout
        while clock() < deadline and self.child.poll() is None and not self.signals:
            msgs = self.store.tune[self._tune_seen :]
            for i, m in enumerate(msgs):
                if m["cid"] == cid and m["k"] in kinds:
                    self._tune_seen += i + 1
                    return m
            self.pump(0.05)
        return None

    def tune(self) -> None:
        from pipeprof.env import usable_cores

        from . import tune as tuning

        key = self.store.main_loader()
        step = self._step_rate(key) if key else None
        if step is None:
            self.tune_result = {"error": "no step measured in the window: nothing to tune against"}
            return
        cid, label = key
        self.server.send(cid, {"cmd": "tune", "loader": label})
        paused = self._await(cid, {"tune_paused", "tune_error"}, 120.0)
        if paused is None or paused["k"] == "tune_error":
            self.server.send(cid, {"cmd": "resume"})
            why = paused.get("error") if paused else "the loop did not reach a step boundary within 120 s"
            self.tune_result = {"error": f"no pause: {why}"}
            return
        self.tuned, t0 = label, clock()
        self.o.log(
            f"pipeprof watch: paused {label} (rank {self.store.rank(cid)}) at a step boundary: measuring "
            f"its loader alone ({len(paused.get('stopped') or [])} of the job's workers stopped meanwhile); the "
            f"step ran at {step:,.1f} samples/s"
        )
        # the job's ranks on this machine share its cores, each with its own workers, and the pause meets none of
        # the others' load: this rank is read on its share (run.json's tune: local_ranks, cores_per_rank)
        ranks = self.store.ranks(label)
        cores = usable_cores()["usable"] / ranks
        seen = tuning.search(
            lambda w: self._measure(cid, w, tuning.policy(self.o.window_s, tuning.point_cap(self.o.tune_max_s))),
            step,
            self.store.loaders[label]["settings"].get("num_workers") or 0,
            max(1, math.floor(cores)),  # the search counts workers: whole cores
            paused.get("batches_per_pass"),
        )
        note = tuning.curve_note(seen, paused.get("batches_per_pass"))
        self.tune_result = {
            "loader": label,
            "step_samples_per_s": step,
            "curve_note": note,
            "local_ranks": ranks,
            "cores_per_rank": cores,
            "threads_now": paused.get("threads"),
            "device": self.device(),
        }
        resume: dict = {"cmd": "resume"}
        try:
            self._tune_actions(cid, label, step, cores, paused.get("user") or {}, t0)
            resume |= self._threads_ask(label, step, cores)
        finally:
            self.server.send(cid, resume)
            resumed = self._await(cid, {"tune_resumed"}, 30.0)
            paused_s = resumed["paused_s"] if resumed else clock() - t0
            self.o.log(f"pipeprof watch: resumed {label} after a pause of {paused_s:.1f} s")
            self.tune_result["paused_s"] = paused_s
        if resume.get("step_threads"):
            self._threads_read(cid, resume["step_threads"])

    def _threads_ask(self, label: str, step: float, cores: float) -> dict:
        """A CPU step that the recommended count leaves fewer cores than its intra-op threads: the loop's next steps
        at that many threads (the hook's ``ThreadsTrial``, about 2 s of steps), read as the step at that count
        (``tune.recommend``), where a count's prediction would otherwise scale the step's rate to the threads, which
        missed both ways on held-out scripts (docs/measured.md, "a segmentation script"). {} where none."""
        from .folder import build_rows

        threads = self._cpu_threads()
        pick = self._recommend(build_rows(self), cores).get("recommended_workers") if threads else None
        k = tuning_module().step_threads(threads, cores, pick) if pick is not None else None
        if not k or k >= threads:
            return {}
        batch = self.store.loaders[label].get("settings", {}).get("batch_size") or 1
        return {"step_threads": int(k), "steps": int(min(200, max(20, 2.0 * step / batch)))}

    def _cpu_threads(self) -> Optional[int]:
        """The tuned process's intra-op threads (read in the pause) where its step runs on the CPU, else None."""
        return self.tune_result.get("threads_now") if self.device() == "cpu" else None

    def _threads_read(self, cid: int, threads: int) -> None:
        """The steps the hook's ``ThreadsTrial`` timed, read as the watch reads its steps: their samples over their
        time pooled, the ratio estimator's interval (``stats.pooled_rate_ci95``)."""
        got = self._await(cid, {"tune_step_threads"}, 60.0)
        times, samples = (got or {}).get("step_s") or [], (got or {}).get("samples") or []
        if len(times) < 10:
            self.tune_result["step_at_threads"] = {"threads": threads, "error": "the loop ran too few steps after"}
            return
        rate, low, high = pooled_rate_ci95(samples, times)
        stats = {"samples_per_s": rate, "samples_per_s_ci95_low": low, "samples_per_s_ci95_high": high}
        self.tune_result["step_at_threads"] = {"threads": threads, "steps": len(times)} | stats
        self.o.log(
            f"pipeprof watch:   the step at {threads} intra-op thread{'' if threads == 1 else 's'}: "
            f"{stats['samples_per_s']:,.1f} samples/s ({stats['samples_per_s_ci95_low']:,.1f}-"
            f"{stats['samples_per_s_ci95_high']:,.1f}), the loop's next {len(times)} steps"
        )

    def _tune_actions(self, cid: int, label: str, step: float, cores: float, user: dict, t0: float) -> None:
        """After the curve: the hand-off at the recommended count, then the actions that apply there, each read
        alone with the user's loader before and after them while ``--tune-max-s`` lasts (those left out named)."""
        from .folder import build_rows

        self.timeline = self.monitor.timeline()  # the rows so far, for the answer the actions are planned on
        pick = self._recommend(build_rows(self), cores).get("recommended_workers")
        if pick is None:
            return
        self._pause_handoff(cid, pick, t0)
        if "error" in user:
            self.tune_result["actions_error"] = user["error"]
            return
        planned = self._plan_actions(label, pick, user, cores)
        if planned is None:
            return
        tried = self._run_planned(cid, label, pick, [p for p in planned if p.why_not is None], step, t0)
        self._with_snippets(label, tried, user)
        self.tune_result |= {
            "actions_at_workers": pick,
            "actions": tried
            + [{"id": p.id, "action": p.action, "why_not": p.why_not} for p in planned if p.why_not is not None],
            "best_action": (best := tuning_module().best_action(tried) or {}).get("id"),
            "best_as_good": tuning_module().as_good(best or None, tried),
            "actions_timed_region": tuning_module().ACTION_REGION,
            "user_pipeline": user,
        }

    def _pause_handoff(self, cid: int, pick: int, t0: float) -> None:
        tuning = tuning_module()
        policy = tuning.policy(self.o.window_s, self._left(t0, tuning.point_cap(self.o.tune_max_s)))
        self.monitor.set_trial(f"tune handoff w{pick}")
        cmd = {"cmd": "handoff", "workers": pick, "policy": policy}
        got = self._ask(cid, cmd, "tune_handoff", policy["max_trial_s"] + 60.0)
        self.monitor.set_trial(None)
        rate = (got.get("stats") or {}).get("samples_per_s")
        self.o.log(
            f"pipeprof watch:   hand-off alone at {pick} workers: "
            + (f"{rate:,.1f} samples/s" if rate else f"no rate ({got.get('error')})")
        )

    def _plan_actions(self, label: str, pick: int, user: dict, cores: float) -> Optional[list]:
        """``actions.plan`` on the watched answer (the same analysis as the run folder's, without re-draws), at
        the recommended count, with what the pause read of the user's dataset; None without an answer."""
        from pipeprof import actions

        from .answer import analyse_loaders
        from .folder import build_rows

        self.timeline = self.monitor.timeline()
        rows = build_rows(self)
        groups = analyse_loaders(rows, cores, self.device(), 0)["groups"]
        answer = next((a for a in groups if a.key.get("loader") == label), None)
        watched = next((r for r in rows if r["loader"] == label and r["kind"] == "end_to_end"), None)
        if answer is None or watched is None:
            return None
        settings = self.store.loaders[label]["settings"]
        knobs = {k: settings.get(k) for k in ("pin_memory", "persistent_workers", "in_order") if k in settings}
        row = watched | {"num_workers": pick} | knobs
        facts = actions.Facts(self.device(), "loader", prefetch_factor=settings.get("prefetch_factor") or 2, user=user)
        return actions.plan(answer, row, facts)

    def _run_planned(self, cid: int, label: str, pick: int, todo: list, step: float, t0: float) -> list[dict]:
        """The user's loader, each planned action's variant in turn (the pipeline's changes first), then the
        loader again (``tune.bracketed``); an action the budget has no room for is listed as skipped."""
        from pipeprof.actions import ACTIONS

        tuning = tuning_module()
        # the dataset's changes first, those that change what the loader hands over (bytes, uint8) before others
        todo = sorted(todo, key=lambda p: (not ACTIONS[p.id].on_user, not ACTIONS[p.id].new_handoff))
        if not todo:
            return []
        cap = max(tuning.point_cap(self.o.tune_max_s), min(20.0, self._left(t0, math.inf) / (len(todo) + 2)))
        skipped = f"--tune-max-s {self.o.tune_max_s:g} s ran out"
        if self._left(t0, math.inf) < 2 * cap:  # no room for the baseline and one variant: none is read
            return [{"id": p.id, "action": p.action, "skipped": skipped} for p in todo]
        before, tried, read = self._side(cid, pick, None, {}, cap), [], []
        for p in todo:
            if self._left(t0, math.inf) < 2 * cap:  # room for this side and the baseline's second reading
                tried.append({"id": p.id, "action": p.action, "skipped": skipped})
                continue
            read.append((p, self._side(cid, pick, p.id, p.params, cap)))
        # the second baseline reading within what is left of the budget, not a whole cap past it (a pause overran
        # its budget by a full cap's tail: docs/measured.md)
        room = self._left(t0, cap)
        after = self._side(cid, pick, None, {}, room) if read and room >= cap / 2 else None
        ends = self._step_stats((cid, label))  # the watched step's interval, the same for every action
        for p, side in read:
            entry = tuning.with_step(
                tuning.bracketed(before, side, after, len(read)),
                step,
                (ends["samples_per_s_ci95_low"], ends["samples_per_s_ci95_high"]),
            )
            tried.append(entry | {"id": p.id, "action": p.action, "params": p.params})
            self._log_action(tried[-1])
        return tried

    def _side(self, cid: int, workers: int, action: Optional[str], params: dict, cap: float) -> dict:
        name = action or "baseline"
        self.monitor.set_trial(f"tune side {name}")
        policy = tuning_module().policy(self.o.window_s, cap)
        cmd = {"cmd": "side", "workers": workers, "device": self.device(), "action": action, "params": params}
        got = self._ask(cid, cmd | {"policy": policy}, "tune_side", cap + 120.0)
        self.monitor.set_trial(None)
        stats = got.get("stats") or {"error": got.get("error")}
        pid = self.store.procs.get(cid, {}).get("pid")
        if pid and stats.get("t_measure_start_s") is not None:  # the training process's CPU in the side's windows
            from .folder import cpu_columns

            spans = [(stats["t_measure_start_s"], stats["t_measure_end_s"])]
            stats["main_cpu_pct_mean"] = cpu_columns(self.procs, spans, {pid}, set())["main_cpu_pct_mean"]
        rate = stats.get("samples_per_s")
        self.o.log(
            f"pipeprof watch:   {name} at {workers} workers: "
            + (f"{rate:,.1f} samples/s" if rate else f"no rate ({stats.get('error')})")
        )
        return stats

    def _log_action(self, entry: dict) -> None:
        if entry.get("measured"):
            self.o.log(
                f"pipeprof watch:   {entry['action']}: loader {entry['action_gain_frac']:+.1%} "
                f"({entry['action_gain_ci95_low']:+.1%} … {entry['action_gain_ci95_high']:+.1%}), end to end "
                f"{entry['predicted_e2e_gain_frac']:+.1%} predicted"
            )

    def _with_snippets(self, label: str, tried: list[dict], user: dict) -> None:
        """Each tried action's code to write: the user pipeline's snippet, or the DataLoader keyword."""
        from pipeprof.actions import ACTIONS

        from .framework_snippets import in_framework

        loader = self.store.loaders[label]
        site = f"{loader.get('path')}:{loader.get('line')}"
        for entry in tried:
            snip = (user.get(entry["id"]) or {}).get("snippet") if ACTIONS[entry["id"]].on_user else None
            snip = in_framework(entry["id"], loader, snip, user)  # timm's, Lightning's terms where they built it
            entry["snippet"] = (
                snip.replace("{site}", site)
                if snip
                else tuning_module().knob_snippet(site, entry.get("params") or {}, loader)
            )

    def _left(self, t0: float, most: float) -> float:
        """Seconds of the pause's budget left (``--tune-max-s``), at most ``most``."""
        return min(most, self.o.tune_max_s - (clock() - t0))

    def _measure(self, cid: int, workers: int, policy: dict) -> dict:
        self.monitor.set_trial(f"tune w{workers}")
        cmd = {"cmd": "measure", "workers": workers, "policy": policy}
        got = self._ask(cid, cmd, "tune_point", policy["max_trial_s"] + 60.0)
        self.monitor.set_trial(None)
        stats = got.get("stats") or {"error": got.get("error")}
        rate = stats.get("samples_per_s")
        self.o.log(
            f"pipeprof watch:   {workers} workers: "
            + (f"{rate:,.1f} samples/s" if rate else f"no rate ({stats['error']})")
        )
        return stats

    def _recommend(self, rows: list[dict], cores: float) -> dict:
        """The pause's recommendation from the stored rows: the tuned rank's watched row, the step, the points."""
        from .tune import change_line, handoff_cap, picked, recommend, threads_line

        label = self.tuned
        mine = [r for r in rows if r["loader"] == label and r["status"] == "ok"]
        watched = (
            next(
                (
                    r
                    for r in mine
                    if r["kind"] == "end_to_end"
                    and r["rank"] == min(x["rank"] for x in mine if x["kind"] == "end_to_end")
                ),
                None,
            )
            if mine
            else None
        )
        step = next((r for r in mine if r["kind"] == "gpu_ceiling"), None)
        points = [r for r in mine if r["kind"] == "cpu_pipeline"]
        if not (watched and step and points):
            return {"error": "the pause measured no worker count, or the window no step: no recommendation"}
        cpu_threads = self._cpu_threads()
        at = self.tune_result.get("step_at_threads")
        at = at if at and at.get("samples_per_s") else None
        found = recommend(points, watched, step, cores, handoff_cap(mine), cpu_threads, at)
        loader, pick = self.store.loaders[label], picked(found)
        return found | {
            "site": f"{loader.get('path')}:{loader.get('line')}",
            "change": change_line(loader, int(watched["num_workers"]), pick and pick.workers),
            "threads_line": threads_line(
                cpu_threads, cores, pick and pick.workers, step, self.tune_result.get("step_at_threads")
            ),
        }
