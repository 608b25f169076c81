"""Random faults over a pipelined training run, a resume after each, and the two checks that
say nothing was lost or doubled.

    PYTHONPATH=. python scripts/chaos.py [--iterations 20] [--faults 20] [--seed 0] [--out DIR]
                                         [--set key=value ...]

1. An uninterrupted pipelined run (``run.max_staleness=1`` unless ``--set`` says otherwise): the
   reference node table.
2. The same command in another home (the same run id: node ids derive from it), started again and again; each start but the last gets
   one fault at a random moment (after a random number of new stage outputs, plus up to a second):
   ``kill9`` (SIGKILL to the command's process group), ``sigterm`` (it must end within 20 s with
   exit 143 and no process of it left), ``outage`` (the start tracks to an MLflow server that is
   down; stopped by SIGTERM later), ``full-disk`` (the home is a small tmpfs, filled to the last
   byte; the run must end with exit 2, and resumes once the ballast is gone; only as root).
3. The final node table equals the reference's (timing columns aside), no node twice; every MLflow
   (key, step) of the run is recorded exactly once and the keys and steps are the reference's.

All commands share one Prefect server that this script starts (a server start is tens of
seconds on a loaded machine; each command's own temporary server and its stop on signals are
tested by tests/cli/test_signals_train.py). Exit 0 and one summary line when both checks pass; 1
with the differences otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[1]
VOLATILE = ["created_at", "gen_seconds"]
FAULTS = ("kill9", "sigterm", "outage", "full-disk")
STOP_S = 20.0  # SIGTERM must end the command within this
RUN_ID = "chaos"


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (by /proc parent links), zombies left out."""
    parent, state = {}, {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                parent[int(d.name)], state[int(d.name)] = int(fields[1]), fields[0]
            except (OSError, IndexError, ValueError):
                pass
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        kids = {c for c, pp in parent.items() if pp == p and state.get(c) != "Z"}
        out |= kids
        todo.extend(kids)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Chaos:
    def __init__(self, args: argparse.Namespace, out: Path) -> None:
        self.args, self.out = args, out
        self.rng = random.Random(args.seed)
        self.env = dict(os.environ, PYTHONPATH=str(ROOT), PREFECT_HOME=str(out / "prefect"),
                        MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true",
                        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300", PYTHONUNBUFFERED="1")
        self.env.pop("PREFECT_API_URL", None)
        self.log = open(out / "chaos.log", "a")  # noqa: SIM115 - the commands' output, kept for a post-mortem

    def command(self, home: Path, run_id: str, tracking_uri: str | None = None) -> list[str]:
        sets = [f"run.iterations={self.args.iterations}", "run.max_staleness=1", "run.threads=1",
                *self.args.overrides]
        cmd = [sys.executable, "-m", "flows.cli", "train", "--config", self.args.config, "--run-id", run_id,
               "--home", str(home)]
        for s in sets:
            cmd += ["--set", s]
        return cmd + (["--tracking-uri", tracking_uri] if tracking_uri else [])

    def start(self, cmd: list[str]) -> subprocess.Popen:
        self.log.write(f"\n$ {' '.join(cmd)}\n")
        self.log.flush()
        self.current = subprocess.Popen(cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        return self.current

    def stop_current(self) -> None:
        """SIGKILL to the command in flight (its own session), when the script itself is stopped."""
        proc = getattr(self, "current", None)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def run_clean(self, home: Path, run_id: str) -> None:
        t0 = time.monotonic()
        rc = self.start(self.command(home, run_id)).wait()
        if rc != 0:
            raise SystemExit(f"the uninterrupted run failed (exit {rc}); see {self.out / 'chaos.log'}")
        print(f"reference run: {time.monotonic() - t0:.0f} s", flush=True)

    # -- faults ---------------------------------------------------------------------------------
    def outputs(self, home: Path, run_id: str) -> int:
        run = home / "runs" / run_id
        return sum(1 for _ in run.glob("staging/*/*.parquet")) + sum(1 for _ in run.glob("checkpoints/iter=*"))

    def wait_moment(self, proc: subprocess.Popen, home: Path, run_id: str) -> bool:
        """Until a random number (1-6) of new stage outputs exist, then up to 1 s more; False if
        the command ended first."""
        target = self.outputs(home, run_id) + self.rng.randint(1, 6)
        while self.outputs(home, run_id) < target:
            if proc.poll() is not None:
                return False
            time.sleep(0.1)
        time.sleep(self.rng.uniform(0, 1.0))
        return proc.poll() is None

    def sigterm(self, proc: subprocess.Popen) -> str | None:
        """SIGTERM to the group; a problem (slow, wrong exit, processes left) or None."""
        kids = descendants(proc.pid)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return "did not end within 60 s of SIGTERM"
        took = time.monotonic() - t0
        deadline = time.monotonic() + 10  # the temporary server stops itself on its parent's death
        while time.monotonic() < deadline and [p for p in kids if alive(p)]:
            time.sleep(0.2)
        left = [p for p in kids if alive(p)]
        for p in left:
            os.kill(p, signal.SIGKILL)
        problems = [f"took {took:.1f} s"] if took > STOP_S else []
        problems += [f"exit {rc}"] if rc not in (143, 0) else []  # 0: it had just finished
        problems += [f"{len(left)} processes left"] if left else []
        return ", ".join(problems) or None

    def kill9(self, proc: subprocess.Popen) -> None:
        kids = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and [p for p in kids if alive(p)]:
            time.sleep(0.2)
        for p in kids:  # what the kernel's parent-death signal did not end (not expected)
            if alive(p):
                os.kill(p, signal.SIGKILL)

    def fill(self, home: Path) -> Path:
        ballast = home / "ballast"
        with open(ballast, "wb", buffering=0) as f:  # unbuffered: nothing left to flush (and fail) at close
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
            except OSError:
                pass
            try:  # the last bytes
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
            except OSError:
                pass
        return ballast

    def one_fault(self, kind: str, home: Path, run_id: str) -> tuple[str, str | None]:
        """Start the command, inject ``kind`` at a random moment; (what happened, a problem or None)."""
        down = f"http://127.0.0.1:{_closed_port()}" if kind == "outage" else None
        proc = self.start(self.command(home, run_id, down))
        if not self.wait_moment(proc, home, run_id):
            return f"{kind}: the run finished first (exit {proc.returncode})", None if proc.returncode == 0 else \
                f"exit {proc.returncode} before the fault"
        if kind == "kill9":
            self.kill9(proc)
            return kind, None
        if kind in ("sigterm", "outage"):
            return kind, self.sigterm(proc)
        ballast = self.fill(home)  # full disk: the run must end by itself with exit 2
        try:
            rc = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            self.kill9(proc)
            rc = None
        finally:
            ballast.unlink()
        return kind, None if rc in (2, 0) else f"full disk ended with exit {rc}"

    # -- checks ---------------------------------------------------------------------------------
    @staticmethod
    def nodes(home: Path, run_id: str) -> pl.DataFrame:
        files = sorted((home / "shards" / "nodes" / f"run_id={run_id}").glob("iteration=*/final.parquet"))
        return pl.concat([pl.read_parquet(f) for f in files]).drop(VOLATILE).sort("node_id")

    @staticmethod
    def metric_counts(home: Path, run_id: str) -> dict[tuple[str, int], int]:
        mlflow_run = (home / "runs" / run_id / "mlflow_run_id").read_text().strip()
        with sqlite3.connect(home / "mlflow.db") as con:
            rows = con.execute("select key, step, count(*) from metrics where run_uuid = ? group by key, step",
                               (mlflow_run,)).fetchall()
        return {(k, s): n for k, s, n in rows}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(ROOT / "configs" / "small-ci.yaml"))
    ap.add_argument("--iterations", type=int, default=20)
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="the faults' random choices (kind, moment)")
    ap.add_argument("--kinds", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    ap.add_argument("--cycle", action="store_true", help="take the kinds in turn (the moments stay random)")
    ap.add_argument("--disk", default="1g", help="size of the chaos home's tmpfs (full-disk faults)")
    ap.add_argument("--out", type=Path, default=None, help="working directory (default: a new temporary one)")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="trace-chaos-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PREFECT_HOME"] = str(out / "prefect")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "600")
    sys.path.insert(0, str(ROOT))
    from prefect.settings import PREFECT_API_URL

    from flows.lifecycle import temporary_server

    chaos = Chaos(args, out)
    kinds = [k for k in args.kinds.split(",") if k]
    clean_home, home = out / "clean", out / "chaos"
    mounted = "full-disk" in kinds and _tmpfs(home, args.disk)
    if "full-disk" in kinds and not mounted:
        print("full-disk faults left out: a tmpfs needs root and mount", flush=True)
        kinds.remove("full-disk")
    t0 = time.monotonic()

    def _stopped(signum, _frame):  # unwind: the command in flight, the tmpfs, the server
        raise SystemExit(f"chaos: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, _stopped)
    with contextlib.ExitStack() as stack:
        stack.enter_context(temporary_server())
        chaos.env["PREFECT_API_URL"] = PREFECT_API_URL.value()
        if mounted:
            stack.callback(subprocess.run, ["umount", "-l", str(home)], capture_output=True)
        stack.callback(chaos.stop_current)  # first on the way out
        chaos.run_clean(clean_home, RUN_ID)
        problems, done = [], []
        for k in range(args.faults):
            kind = kinds[k % len(kinds)] if args.cycle else chaos.rng.choice(kinds)
            what, problem = chaos.one_fault(kind, home, RUN_ID)
            done.append(what)
            print(f"fault {k + 1}/{args.faults}: {what}" + (f"  PROBLEM: {problem}" if problem else ""), flush=True)
            if problem:
                problems.append(f"fault {k + 1} ({kind}): {problem}")
        rc = chaos.start(chaos.command(home, RUN_ID)).wait()  # the last resume, to the end
        if rc != 0:
            problems.append(f"the final resume exited {rc}")
        got, want = chaos.nodes(home, RUN_ID), chaos.nodes(clean_home, RUN_ID)
        same = got.columns == want.columns and got.height == want.height and got.equals(want)
        if not same:
            differ = [c for c in want.columns if c in got.columns and got.height == want.height
                      and not got[c].equals(want[c])]
            problems.append(f"node table differs: {got.height} vs {want.height} rows, columns {differ}")
        if got["node_id"].n_unique() != got.height:
            problems.append("a node is recorded twice")
        counts, ref = chaos.metric_counts(home, RUN_ID), chaos.metric_counts(clean_home, RUN_ID)
        twice = {k: n for k, n in counts.items() if n != 1}
        if twice:
            problems.append(f"MLflow (key, step) recorded more than once: {sorted(twice.items())[:5]}")
        if set(counts) != set(ref):
            problems.append(f"MLflow (key, step) differ from the reference: missing {sorted(set(ref) - set(counts))[:5]}, "
                            f"extra {sorted(set(counts) - set(ref))[:5]}")
    kinds_done = {k: sum(w.startswith(k) for w in done) for k in FAULTS}
    print(f"{len(done)} faults ({', '.join(f'{k} {n}' for k, n in kinds_done.items() if n)}) over a "
          f"{args.iterations}-iteration pipelined run in {time.monotonic() - t0:.0f} s; nodes {got.height} "
          f"{'=' if same else '!='} reference; {len(counts)} MLflow (key, step), "
          f"{'each once' if not twice else f'{len(twice)} not once'}; work dir {out}", flush=True)
    for p in problems:
        print("PROBLEM:", p, flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
