"""A/B of the kernels: an older revision against the working tree, each in its own process.

    python scripts/ab.py --old REV [WORKLOAD ...] [--rounds 15] [--threads N]
    python scripts/ab.py --old REV --bench "--only decode varlen --quick" [--rounds 6]

The old revision's ``kernels/`` and ``attnbench/`` are extracted with ``git archive`` into a
temporary folder (``--new REV`` does the same for the other side, else the working tree
is the new side).  Each side runs in its own Python process that imports its own tree's
``attnbench`` and ``kernels`` (a ``sitecustomize`` put first on ``PYTHONPATH`` maps
``attnbench.kernels`` to that tree's folder, ahead of an editable install's finder; each
process reports where its kernels came from, and the tool stops if that is not its tree).
Each tree keeps its own Numba cache.

Two ways to time:

- **Workloads** (default ``forward decode varlen``): calls of the public API, timed by
  two long-lived worker processes.  Every case is compiled and called once before the
  rounds (warm-up excluded).  In each round, every case is timed on both sides, the
  order alternating (old first in even rounds, new first in odd ones), each side after a
  settle pause and one untimed call (a parallel loop's threads wake slowly after a
  pause), as the median of ``--reps`` calls.  Workloads: ``forward`` (B=1, H=12, D=64,
  float32, causal and not, at each ``--L``), ``mods`` (sliding window 256 + causal,
  softcap 30, ALiBi, at the first ``--L``), ``decode`` (one query step against a cache of
  ``--decode-L`` keys, D=128, GQA 32/8 contiguous and in pages of 16 and 256, B=8, MHA
  8/8, and a bfloat16 cache), ``varlen`` (packed sequences of ``--varlen-L`` tokens
  halving down to 64, forward and backward, with softcap + causal, ALiBi + window and
  dropout); ``--match`` keeps the cases whose name contains a given text.  A case the
  old revision refuses is reported and skipped.
- **``--bench ARGS``**: ``attnbench bench ARGS`` (e.g. ``--only decode --quick``; every
  section when ARGS is empty) run as a whole process per side and round, in the same
  alternating order, after ``--warmup`` untimed runs per side (which fill each tree's
  Numba cache).  Every row of ``bench.csv`` measured on both sides is a case: its
  per-round value is the row's ``median_ms``.  This is the A/B of "the last commit before
  a refactor against the tree after it" for every section.  ``attnbench compare A B``
  does not do it: it compares sweeps (``attnbench run``/``sweep`` result folders), not
  ``bench.csv``, and from one run per side it cannot see the run-to-run variation that
  rounds of whole runs in alternation show.

For each case the tool prints the median time of each side (the median of its rounds'
values), the median of the per-round ratios new / old and their distribution-free 95%
interval (order statistics, :func:`kernels.stats.median_interval`; it needs 6 rounds or
more, shown as ``n/a`` below), and the machine record (:mod:`attnbench.measure.machine`,
as the new side's process reads it).  ``--json PATH`` writes every round's values and
both sides' machine records.  Exit status 0; 2 when a side cannot be set up.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
#: The reply prefix of a worker's protocol lines (anything else on its stdout is ignored).
REPLY = "@@ab "
#: Workloads run when none is named.
DEFAULT_WORKLOADS = ("forward", "decode", "varlen")
WORKLOADS = ("forward", "mods", "decode", "varlen")

#: Put first on a side's PYTHONPATH: ``attnbench.kernels`` is the tree's ``kernels/`` even
#: where an editable install of another checkout maps that name (its finder is asked before
#: the harness's own, which a checkout appends last).
SITECUSTOMIZE = '''
import importlib.util, os, sys
from pathlib import Path

_TREE = Path(os.environ["ATTNBENCH_AB_TREE"])


class _TreeKernels:
    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname != "attnbench.kernels":
            return None
        return importlib.util.spec_from_file_location(
            fullname, _TREE / "kernels" / "__init__.py",
            submodule_search_locations=[str(_TREE / "kernels")])


sys.meta_path.insert(0, _TreeKernels)
'''


# --- the worker: one side's process --------------------------------------------------------

def _cases(workload: str, sizes: dict) -> dict:
    """``{name: make}`` of one workload: ``make()`` builds a case's inputs on this process's
    kernels (public API only) and returns the call to time."""
    import numpy as np

    from attnbench import kernels

    rng = np.random.default_rng(0)
    cases = {}

    def dense(L, **keywords):
        H, D = 12, 64
        q, k, v = (rng.standard_normal((1, H, L, D), dtype=np.float32) for _ in range(3))
        keywords = {name: value() if callable(value) else value
                    for name, value in keywords.items()}
        return lambda: kernels.attention(q, k, v, **keywords)

    if workload == "forward":
        for L in sizes["L"]:
            for causal in (False, True):
                cases[f"forward L={L} {'causal' if causal else 'full'}"] = (
                    lambda L=L, c=causal: dense(L, causal=c))
    elif workload == "mods":
        L, slopes = sizes["L"][0], np.array([2.0 ** -(h + 1) for h in range(12)])
        cases[f"mods L={L} window 256 + causal"] = lambda: dense(
            L, causal=True, mask_mod=lambda: kernels.mods.sliding_window(256))
        cases[f"mods L={L} softcap 30"] = lambda: dense(
            L, score_mod=lambda: kernels.mods.softcap(30.0))
        cases[f"mods L={L} alibi"] = lambda: dense(
            L, score_mod=lambda: kernels.mods.alibi(slopes))
    elif workload == "decode":
        L, D = sizes["decode_L"], 128

        def step(B, H, Hkv, page=None, half=False):
            dtype = np.float32
            if half:
                import ml_dtypes
                dtype = ml_dtypes.bfloat16
            if page is None:
                shape, table = (B, Hkv, L, D), None
            else:
                pages = -(-L // page)
                shape = (B * pages, Hkv, page, D)
                table = rng.permutation(B * pages).reshape(B, pages)
            kc, vc = (rng.standard_normal(shape, dtype=np.float32).astype(dtype)
                      for _ in range(2))
            q = rng.standard_normal((B, H, 1, D), dtype=np.float32).astype(dtype)
            return lambda: kernels.attention_with_kvcache(
                q, kc, vc, cache_seqlens=np.full(B, L), block_table=table)

        for label, shape in (("B=1 H=32 Hkv=8", (1, 32, 8)),
                             ("B=1 H=32 Hkv=8 page 16", (1, 32, 8, 16)),
                             ("B=1 H=32 Hkv=8 page 256", (1, 32, 8, 256)),
                             ("B=1 H=8 Hkv=8", (1, 8, 8)),
                             ("B=8 H=32 Hkv=8", (8, 32, 8))):
            cases[f"decode L={L} {label}"] = lambda shape=shape: step(*shape)
        cases[f"decode L={L} B=1 H=32 Hkv=8 bfloat16"] = lambda: step(1, 32, 8, half=True)
    elif workload == "varlen":
        H, D = 8, 64
        lengths, n = [], sizes["varlen_L"]
        while n >= 64 or not lengths:
            lengths.append(n)
            n //= 2
        cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        q = rng.standard_normal((int(cu[-1]), H, D), dtype=np.float32)
        variants = {"softcap causal": lambda: dict(score_mod=kernels.mods.softcap(30.0),
                                                   causal=True),
                    "alibi + window": lambda: dict(
                        score_mod=kernels.mods.alibi(np.linspace(0.1, 0.4, H)),
                        mask_mod=kernels.mods.sliding_window(256)),
                    "dropout": lambda: dict(dropout_p=0.1, seed=3)}

        def forward(keywords):
            kw = keywords()
            return lambda: kernels.attention_varlen(q, q, q, cu, cu, **kw)

        def backward(keywords):
            kw = keywords()
            out, lse = kernels.attention_varlen(q, q, q, cu, cu, return_lse=True, **kw)
            dout = np.ones_like(out)
            return lambda: kernels.attention_varlen_backward(q, q, q, dout, cu, cu, out=out,
                                                             lse=lse, **kw)

        for label, keywords in variants.items():
            name = f"varlen {int(cu[-1])} tokens {label}"
            cases[name + " forward"] = lambda kw=keywords: forward(kw)
            cases[name + " backward"] = lambda kw=keywords: backward(kw)
    else:
        raise ValueError(f"unknown workload {workload!r}")
    return cases


def _reply(message: dict) -> None:
    sys.stdout.write(REPLY + json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> int:
    """The worker: set up cases, time them on request (JSON lines on stdin and stdout)."""
    import numpy as np

    import attnbench
    from attnbench import kernels

    cases, record = {}, None
    _reply({"ready": True, "kernels": kernels.__file__, "attnbench": attnbench.__file__})
    for line in sys.stdin:
        request = json.loads(line)
        op = request["op"]
        if op == "setup":
            if request.get("threads"):
                import numba
                numba.set_num_threads(request["threads"])
            refused = {}
            for workload in request["workloads"]:
                for name, make in _cases(workload, request["sizes"]).items():
                    if request["match"] and not any(text in name for text in request["match"]):
                        continue
                    try:
                        call = make()
                        call()  # compiles
                        call()
                        cases[name] = call
                    except Exception as error:  # noqa: BLE001 (an old revision's refusal)
                        refused[name] = f"{type(error).__name__}: {error}"[:200]
            try:
                from attnbench.measure.machine import machine_record
                record = machine_record()
            except Exception as error:  # noqa: BLE001 (an old harness)
                record = {"error": f"{type(error).__name__}: {error}"[:200]}
            _reply({"cases": list(cases), "refused": refused, "record": record})
        elif op == "time":
            call = cases[request["case"]]
            call()  # wakes the threads after the pause, untimed
            samples = []
            for _ in range(request["reps"]):
                start = time.perf_counter()
                call()
                samples.append(time.perf_counter() - start)
            _reply({"median": float(np.median(samples)), "samples": samples})
        elif op == "quit":
            break
    return 0


def run_bench(argv: list[str]) -> int:
    """``attnbench bench`` in this tree (the process's sitecustomize chose the tree)."""
    from attnbench import kernels
    from attnbench.cli import main

    print(f"{REPLY}{json.dumps({'kernels': kernels.__file__})}", flush=True)
    return main(["bench", *argv])


# --- the driver ---------------------------------------------------------------------------

class Side:
    """One revision: its tree, the environment of its processes, its worker."""

    def __init__(self, label: str, tree: Path, boot: Path, threads: int | None):
        self.label, self.tree, self.worker = label, tree, None
        self.env = dict(os.environ, ATTNBENCH_AB_TREE=str(tree),
                        PYTHONPATH=os.pathsep.join(
                            filter(None, [str(boot), str(tree), os.environ.get("PYTHONPATH")])))
        if threads:
            self.env["NUMBA_NUM_THREADS"] = str(threads)

    def check_kernels(self, path: str) -> None:
        if not Path(path).resolve().is_relative_to(self.tree.resolve()):
            raise SystemExit(f"{self.label}: kernels imported from {path}, not from "
                             f"{self.tree}")

    def start(self) -> None:
        self.worker = subprocess.Popen(
            [sys.executable, str(HERE), "--serve"], env=self.env, cwd=self.tree,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.check_kernels(self.receive()["kernels"])

    def receive(self) -> dict:
        for line in self.worker.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        raise SystemExit(f"{self.label}: the worker ended (exit status {self.worker.wait()})")

    def ask(self, **request) -> dict:
        self.worker.stdin.write(json.dumps(request) + "\n")
        self.worker.stdin.flush()
        return self.receive()

    def stop(self) -> None:
        if self.worker and self.worker.poll() is None:
            try:
                self.ask_quit()
            finally:
                try:
                    self.worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.worker.kill()

    def ask_quit(self) -> None:
        self.worker.stdin.write(json.dumps({"op": "quit"}) + "\n")
        self.worker.stdin.close()

    def bench(self, args: list[str], out: Path) -> dict[str, float]:
        """One ``attnbench bench`` run: ``{row: median_ms}`` of its measured rows."""
        done = subprocess.run([sys.executable, str(HERE), "--run-bench", "--", *args,
                               "--out", str(out)], env=self.env, cwd=self.tree,
                              capture_output=True, text=True)
        hello = [line for line in done.stdout.splitlines() if line.startswith(REPLY)]
        if not hello:
            raise SystemExit(f"{self.label}: attnbench bench did not start:\n"
                             f"{done.stderr[-2000:]}")
        self.check_kernels(json.loads(hello[0][len(REPLY):])["kernels"])
        if not (out / "bench.csv").is_file():
            raise SystemExit(f"{self.label}: attnbench bench wrote no bench.csv "
                             f"(exit status {done.returncode}):\n{done.stderr[-2000:]}")
        rows = {}
        with open(out / "bench.csv", newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                try:
                    value = float(row["median_ms"])
                except (KeyError, ValueError):
                    continue
                if math.isfinite(value):
                    key = " ".join(f"{name}={row[name]}" for name in (
                        "section", "impl", "variant", "B", "H", "L", "D", "causal", "dtype",
                        "threads") if row.get(name) not in (None, ""))
                    rows[key] = value / 1e3
        return rows


def extract(repo: Path, rev: str, where: Path) -> Path:
    """``kernels/`` and ``attnbench/`` of ``rev`` (``git archive``) in ``where``."""
    archive = subprocess.run(["git", "-C", str(repo), "archive", rev, "kernels", "attnbench"],
                             check=True, capture_output=True).stdout
    where.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def order(round_index: int) -> tuple[str, str]:
    """The sides' order in a round: old first in even rounds, new first in odd ones."""
    return ("old", "new") if round_index % 2 == 0 else ("new", "old")


def summarise(values: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Per case: each side's median and the median of the per-round ratios new / old with
    its distribution-free 95% interval."""
    import numpy as np

    from attnbench.kernels.stats import median_interval

    rows = []
    for case, sides in values.items():
        if not sides["old"] or len(sides["old"]) != len(sides["new"]):
            continue
        ratios = [n / o for n, o in zip(sides["new"], sides["old"], strict=True)]
        ratio, low, high = median_interval(ratios)
        rows.append({"case": case, "old_ms": 1e3 * float(np.median(sides["old"])),
                     "new_ms": 1e3 * float(np.median(sides["new"])), "ratio": ratio,
                     "low": low, "high": high, "rounds": len(ratios)})
    return rows


def format_rows(rows: list[dict]) -> list[str]:
    width = max([len(row["case"]) for row in rows] + [4])
    lines = [f"{'case':{width}s} {'old ms':>9s} {'new ms':>9s} {'new/old':>8s}  95% interval"]
    for row in rows:
        interval = ("n/a (fewer than 6 rounds)" if math.isnan(row["low"])
                    else f"[{row['low']:.3f}, {row['high']:.3f}]")
        lines.append(f"{row['case']:{width}s} {row['old_ms']:9.3f} {row['new_ms']:9.3f} "
                     f"{row['ratio']:8.3f}  {interval}")
    return lines


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workloads", nargs="*", metavar="WORKLOAD",
                        help=f"from {', '.join(WORKLOADS)} (default: "
                             f"{' '.join(DEFAULT_WORKLOADS)})")
    parser.add_argument("--old", required=True, help="the old side: any git revision")
    parser.add_argument("--new", help="the new side: a git revision (default: the working "
                                      "tree)")
    parser.add_argument("--bench", metavar="ARGS",
                        help="time whole 'attnbench bench ARGS' runs instead of workloads "
                             "(ARGS one string, e.g. \"--only decode --quick\"; \"\": every "
                             "section)")
    parser.add_argument("--rounds", type=int, default=15,
                        help="interleaved rounds (default 15; 6 or more for an interval)")
    parser.add_argument("--reps", type=int, default=5,
                        help="timed calls per case, side and round (default 5)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="--bench: untimed runs per side first (default 1)")
    parser.add_argument("--settle", type=float, default=0.1,
                        help="pause before each side's turn, s (default 0.1)")
    parser.add_argument("--threads", type=int, help="Numba threads (default: Numba's)")
    parser.add_argument("--L", type=int, nargs="+", default=[1024, 2048, 4096],
                        help="forward, mods: sequence lengths (default 1024 2048 4096)")
    parser.add_argument("--decode-L", type=int, default=32768,
                        help="decode: keys in the cache (default 32768)")
    parser.add_argument("--varlen-L", type=int, default=2048,
                        help="varlen: the longest packed sequence (default 2048)")
    parser.add_argument("--match", nargs="+", metavar="TEXT",
                        help="workloads: only the cases whose name contains one of these "
                             "(e.g. 'causal', 'page 16')")
    parser.add_argument("--json", type=Path, help="write the rounds and machine records here")
    args = parser.parse_args(argv)
    if args.bench is not None and args.workloads:
        parser.error("--bench times attnbench bench: name no workload")
    unknown = sorted(set(args.workloads) - set(WORKLOADS))
    if unknown:
        parser.error(f"unknown workload {', '.join(unknown)}: choose from {', '.join(WORKLOADS)}")
    args.workloads = args.workloads or list(DEFAULT_WORKLOADS)
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        return serve()
    if argv[:1] == ["--run-bench"]:
        return run_bench(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    args = parse_args(argv)
    repo = Path(subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--show-toplevel"],
                               check=True, capture_output=True, text=True).stdout.strip())
    with tempfile.TemporaryDirectory(prefix="attnbench-ab-") as tmp:
        tmp = Path(tmp)
        boot = tmp / "boot"
        boot.mkdir()
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
        trees = {"old": extract(repo, args.old, tmp / "old"),
                 "new": extract(repo, args.new, tmp / "new") if args.new else repo}
        sides = {label: Side(label, tree, boot, args.threads) for label, tree in trees.items()}
        values, records = {}, {}
        try:
            if args.bench is None:
                _workloads(args, sides, values, records)
            else:
                _benches(args, sides, values, records, tmp)
        finally:
            for side in sides.values():
                side.stop()
    return _report(args, values, records)


def _workloads(args, sides: dict[str, Side], values: dict, records: dict) -> None:
    sizes = {"L": args.L, "decode_L": args.decode_L, "varlen_L": args.varlen_L}
    ready = {}
    for label, side in sides.items():
        side.start()
        ready[label] = side.ask(op="setup", workloads=args.workloads, sizes=sizes,
                                threads=args.threads, match=args.match)
        records[label] = ready[label]["record"]
        for case, why in ready[label]["refused"].items():
            print(f"{label} refused {case}: {why}", flush=True)
    cases = [case for case in ready["new"]["cases"] if case in ready["old"]["cases"]]
    for case in cases:
        values[case] = {"old": [], "new": []}
    for index in range(args.rounds):
        for case in cases:
            for label in order(index):
                time.sleep(args.settle)
                values[case][label].append(
                    sides[label].ask(op="time", case=case, reps=args.reps)["median"])
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def _benches(args, sides: dict[str, Side], values: dict, records: dict, tmp: Path) -> None:
    bench_args = shlex.split(args.bench)
    for label, side in sides.items():
        for run in range(args.warmup):
            side.bench(bench_args, tmp / f"warmup-{label}-{run}")
    for index in range(args.rounds):
        for label in order(index):
            time.sleep(args.settle)
            for case, value in sides[label].bench(bench_args, tmp / f"{label}-{index}").items():
                values.setdefault(case, {"old": [], "new": []})[label].append(value)
            machine = tmp / f"{label}-{index}" / "machine.json"
            if label not in records and machine.is_file():
                records[label] = json.loads(machine.read_text()).get("machine")
        print(f"round {index + 1}/{args.rounds} done", file=sys.stderr, flush=True)


def _report(args, values: dict, records: dict) -> int:
    from attnbench.measure.machine import machine_record, summary_lines

    record = records.get("new") or machine_record()
    if "error" in record:
        record = machine_record()
    print(*summary_lines(record), sep="\n")
    what = f"attnbench bench {args.bench}" if args.bench is not None else " ".join(args.workloads)
    print(f"A/B: old {args.old}, new {args.new or 'the working tree'}; {what}; "
          f"{args.rounds} rounds, load average after {os.getloadavg()[0]:.1f}")
    rows = summarise(values)
    print(*format_rows(rows), sep="\n")
    if args.json:
        args.json.write_text(json.dumps({"old": args.old, "new": args.new, "what": what,
                                         "rows": rows, "rounds": values, "machines": records},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
