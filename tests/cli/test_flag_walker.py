"""A walker of every bundle command's flags on a bundle of every task.

The commands' options are read off the CLI itself (typer's click command), so a flag added later is
walked too, or fails here until this file says how to give it. Each flag is given an ordinary value,
on top of a run that works without it, against a bundle of each task (tests/task_runs.py), and the
outcome is fixed in advance: it runs and answers every input (its effect checked where it has one
to see), or it is refused in one line that names it, exit 2, no traceback. Never both, never a
crash.

A flag whose help says it goes with another ("With --engine ray: ...") is refused without it, for
every command that has one: a flag accepted and ignored looks like it worked.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import typer
from conftest import run_export
from task_runs import TASK_SETUP
from typer.testing import CliRunner

from mlmkit.cli import app
from mlmkit.registry import get_task
from mlmkit.retrieval.index import Index

runner = CliRunner()
CLI = typer.main.get_command(app)
RUN_INFERENCE = ("fill-mask", "classify", "tag", "qa", "embed", "predict")
COMMAND_OF = {"fill-mask": "fill-mask", "classification": "classify", "tagging": "tag", "qa": "qa",
              "embedding": "embed", "sparse-embedding": "embed", "rerank": "classify", "colbert": "embed"}
TASKS = tuple(COMMAND_OF)


def options(command: str) -> list[Any]:
    return [p for p in CLI.commands[command].params if p.param_type_name == "option" and p.opts[0]
            != "--help"]


def one_red_line(r: Any, *names: str) -> str:
    text = " ".join(r.stderr.split())  # rich wraps the line at the terminal width
    assert r.exit_code == 2 and "Traceback" not in r.output and text.startswith("error:") and text.count(
        "error:") == 1, \
        r.output
    for name in names:
        assert name in text, text
    return text


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def bundles(runs: dict[str, Path], task_bundles: dict[str, Path],
            tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The session's bundles of every task; fill-mask's exported again with top_k 3 (its --top-k flag is
    walked with 2)."""
    out = {task: task_bundles[task] for task in TASKS}
    out["fill-mask"] = tmp_path_factory.mktemp("walker") / "fill-mask"
    run_export(runs["fill-mask"], out["fill-mask"], top_k=3)
    return out


INPUTS = {  # the records each task's bundle answers; "id" is carried by --id-column
    "fill-mask": [{"id": i, "text": t}
                  for i, t in enumerate(["the cat [MASK] on the mat", "john went to [MASK]",
                                         "a [MASK] dog"])],
    "qa": [{"id": i, "question": q, "context": "john went to paris and mary saw the river"}
           for i, q in enumerate(["who went", "where did john go", "what did mary see"])],
    "rerank": [{"id": i, "text": "where did john go", "text_pair": d}
               for i, d in enumerate(["john went to paris", "the cat sat on the mat", "mary saw the river"])],
}
PLAIN = [{"id": i, "text": t} for i, t in enumerate(["john went to paris", "the big dog sat on the mat",
                                                      "mary saw the old river near the city"])]


def inputs_file(d: Path, task: str) -> Path:
    f = d / f"{task}.jsonl"
    if not f.exists():
        f.write_text("".join(json.dumps(r) + "\n" for r in INPUTS.get(task, PLAIN)))
    return f


def generic_flag(flag: str, d: Path) -> list[str] | None:
    """The ordinary value of a flag every run_inference command has (KeyError: a task option's flag);
    None: one that the partner test below refuses on its own."""
    out = str(d / "out.parquet")
    return {
        "--input": [],  # the base run's
        "--output": ["--output", out], "--batch-size": ["--batch-size", "2"],
        "--batch-tokens": ["--batch-tokens", "48"],
        "--device": ["--device", "cuda"], "--threads": ["--threads", "1"], "--json": ["--json"],
        "--window": ["--window", "2"], "--workers": ["--workers", "1"], "--on-error": ["--on-error", "skip"],
        "--errors": ["--on-error", "skip", "--errors", str(d / "bad.jsonl")],
        "--resume": ["--resume", "--output", out],
        "--id-column": ["--id-column", "id"], "--max-record-bytes": ["--max-record-bytes", "4096"],
        "--engine": ["--engine", "local"], "--address": None,
        # the default's path: bf16 through OpenVINO where the CPU has bf16 units
        "--precision": ["--precision", "auto"],
        "--min-agreement": ["--precision", "auto", "--min-agreement", "0.5"],
        "--option": ["--option", "no_such_option=1"],  # refused: every task names its options
        "--context": [],  # qa's: the questions are arguments then (below)
        "--chunk-tokens": ["--chunk-tokens", "4"],
        "--chunk-overlap": ["--chunk-tokens", "4", "--chunk-overlap", "1"],
        "--chunk-sentences": ["--chunk-tokens", "4", "--chunk-sentences"],  # embed's
    }[flag]


REFUSED = {"--option": "--option no_such_option is not an option", "--resume": "no unfinished job"}


def task_flag(command: str, flag: str, bundle: Path) -> tuple[str, list[str]]:
    """A task-option flag: its option's name and an ordinary value (its last choice, else the value
    the bundle was exported with, else its default; fill-mask's --top-k: 2 of the export's 3)."""
    from mlmkit.cli.common import command_flags

    o = next(o for o in command_flags(command).values() if flag in o.flags[0].split("/"))
    if o.kind is bool:
        return o.name, [flag]
    saved = json.loads((bundle / "mlmkit.json").read_text()).get("options") or {}
    value = o.choices[-1] if o.choices else 2 if o.name == "top_k" else saved.get(o.name, o.default)
    return o.name, [flag, str(value)]


def declared(task: str) -> set[str]:
    return {"top_k"} if task == "fill-mask" else {o.name for o in get_task(task).options}


def answers(r: Any, argv: list[str]) -> list[dict[str, Any]]:
    if "--output" in argv:
        return pq.read_table(argv[argv.index("--output") + 1]).to_pylist()
    return jsonl(r.stdout)


@pytest.mark.parametrize("task", TASKS)
def test_every_inference_flag_on_a_bundle_of_every_task(bundles: dict[str, Path], task: str,
                                                        tmp_path: Path) -> None:
    """predict and the task's own command, every flag: it runs and answers every input, or it is
    refused in one line naming it (a task option the bundle's task does not have, the commands that
    do not serve this task); the other commands refuse the bundle in one line."""
    bundle, data = bundles[task], inputs_file(tmp_path, task)
    n = len(INPUTS.get(task, PLAIN))
    for command in RUN_INFERENCE:
        base = [command, str(bundle), "--input", str(data)]
        if command not in ("predict", COMMAND_OF[task]):
            one_red_line(runner.invoke(app, base), f"is a {task} bundle")
            continue
        walked = 0
        for p in options(command):
            flag = p.opts[0]
            try:
                extra, name = generic_flag(flag, tmp_path), None
            except KeyError:
                name, extra = task_flag(command, flag, bundle)
            if extra is None:
                continue
            for f in (tmp_path / "out.parquet", tmp_path / "bad.jsonl"):
                f.unlink(missing_ok=True)
            argv, expect = base + extra, n
            if flag == "--context":
                argv, expect = [command, str(bundle), "who went", "where did john go", "--context",
                                "john went to paris"], 2
            r = runner.invoke(app, argv)
            walked += 1
            # an unknown task option; --resume with no job killed (tests/jobs/test_jobdir.py resumes)
            if flag in REFUSED:
                one_red_line(r, REFUSED[flag])
                continue
            if name is not None and name not in declared(task):
                one_red_line(r, flag.split("/")[0], "is not an option of")
                continue
            if flag.startswith("--chunk-") and task != "embedding":
                one_red_line(r, f"is a {task} bundle, and embed chunks texts for embedding bundles")
                continue
            assert r.exit_code == 0, (argv, r.output)
            got = answers(r, argv)
            assert len(got) == expect and not any("error" in g for g in got), (argv, got)
            if flag == "--id-column":
                assert [g["id"] for g in got] == list(range(n))
            if flag == "--device":
                assert "running on the CPU" in " ".join(r.stderr.split())
        assert walked >= 14, command


def partners() -> list[tuple[str, str, str, str | None]]:
    """(command, flag, partner flag, partner value) for every option whose help begins "With --FLAG
    [VALUE]:" or "With --FLAG,"."""
    found = []
    for command, cmd in CLI.commands.items():
        for sub, c in getattr(cmd, "commands", {command: cmd}).items():
            name = command if sub == command else f"{command} {sub}"
            for p in c.params:
                m = re.match(r"With (--[a-z-]+)(?: ([a-z0-9]+))?[:,]", p.help or "")
                if m:
                    found.append((name, p.opts[0], m.group(1), m.group(2)))
    return found


BASE = {  # enough of each command to parse, pointing at files that need not exist: the refusal comes first
    "pretrain": ["pretrain", "c.txt", "--out", "o"],
    "finetune": ["finetune", "classification", "--model", "m", "--train", "t.csv", "--out", "o"],
    "sweep": ["sweep", "classification", "--model", "m", "--train", "t.csv", "--eval", "e.csv", "--out", "o",
              "--search", "lr=1e-5:1e-3"],
    "distill": ["distill", "t", "--out", "o", "--train", "x.txt", "--layers", "1"],
    "index": ["index", "b", "--corpus", "c.jsonl", "--out", "o"],
    **{c: [c, "b", "some text"] for c in RUN_INFERENCE},
}
VALUES = {"--errors": "bad.jsonl", "--address": "auto", "--dims": "8"}


def test_a_flag_that_goes_with_another_is_refused_without_it(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    found = partners()
    assert {("classify", "--errors"), ("predict", "--address"), ("index", "--address"),
            ("finetune", "--log-model"),
            ("pretrain", "--resume-force"), ("distill", "--dims")} <= {(c, f) for c, f, _, _ in found}
    for command, flag, partner, _ in found:
        argv = BASE[command] + [flag] + ([VALUES[flag]] if flag in VALUES else [])
        one_red_line(runner.invoke(app, argv), flag, partner)


def test_the_walker_has_a_value_for_every_flag() -> None:
    """A flag added to an inference command is walked: the table above knows it, or it is a task option."""
    from mlmkit.cli.common import command_flags

    for command in RUN_INFERENCE:
        task_flags = {f for o in command_flags(command).values() for f in o.flags[0].split("/")}
        for p in options(command):
            flag = p.opts[0]
            try:
                generic_flag(flag, Path("."))
            except KeyError:
                assert flag in task_flags, f"{command} {flag}: give it a value in generic_flag"
    assert set(TASK_SETUP) | {"fill-mask"} == set(TASKS)


DOCS = ["john went to paris", "the cat sat on the mat", "mary saw the river near the city", "a big red house"]


def same_hits(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    """The same documents with the same scores but for batching's rounding, best first (two documents of one
    text tie: rounding may order them either way)."""
    sa, sb = {h["id"]: h["score"] for h in a}, {h["id"]: h["score"] for h in b}
    assert len(a) == len(b) and sa.keys() == sb.keys() and all(abs(sa[i] - sb[i]) < 1e-5 for i in sa), (a, b)
    assert all(x["score"] >= y["score"] for x, y in zip(a, a[1:])), a


def walk(command: str, flags: dict[str, list[str] | None]) -> list[str]:
    """The flags of ``command`` in the order the CLI has them, each with its value in ``flags`` (a
    flag missing from it fails: this file must learn how to give it)."""
    seen = [p.opts[0] for p in options(command)]
    missing = sorted(set(seen) - set(flags))
    assert not missing, f"{command}: no value for {missing}"
    return seen


def test_rerank_index_and_search_flags_on_a_bundle_of_every_task(bundles: dict[str, Path],
                                                                 tmp_path: Path) -> None:
    """rerank on a reranker, index on the embedding and SPLADE bundles, search on their indexes: every
    flag runs with its effect seen, or is refused in one line naming it; every other task's bundle is
    refused in one line."""
    docs = tmp_path / "docs.txt"
    docs.write_text("\n".join(DOCS) + "\n")
    records = tmp_path / "docs.jsonl"
    records.write_text("".join(json.dumps({"doc": f"d{i}", "body": t}) + "\n" for i, t in enumerate(DOCS)))
    more = tmp_path / "more.jsonl"
    more.write_text("".join(json.dumps({"_id": f"m{i}", "text": t}) + "\n" for i, t in enumerate(DOCS[:2])))
    # the documents of the index with `more` appended: what BM25 ranks beside it
    every = tmp_path / "every.jsonl"
    every.write_text(records.read_text() + "".join(json.dumps({"doc": f"m{i}", "body": t}) + "\n"
                                                   for i, t in enumerate(DOCS[:2])))
    queries = tmp_path / "queries.jsonl"
    queries.write_text(json.dumps({"q": "where did john go"}) + "\n" + json.dumps({"q": "a cat"}) + "\n")

    # rerank
    rr = {"--query": [], "--input": [], "--text-column": ["--input", str(records), "--text-column", "body"],
          "--top-n": ["--top-n", "2"], "--raw-scores": ["--raw-scores"], "--json": ["--json"],
          "--precision": ["--precision", "fp32"]}
    for task in TASKS:
        base = ["rerank", str(bundles[task]), "--query", "where did john go", "--input", str(docs)]
        if task not in ("rerank", "colbert"):
            one_red_line(runner.invoke(app, base), str(bundles[task]))
            continue
        # MaxSim: a sum over the query's tokens, not a probability; no logits to show raw
        late = task == "colbert"
        plain = jsonl(runner.invoke(app, base).stdout)
        assert sorted(x["index"] for x in plain) == [0, 1, 2,
                                                     3] and all(late or 0 < x["score"] < 1 for x in plain)
        for flag in walk("rerank", rr):
            r = runner.invoke(app, base + rr[flag])
            assert r.exit_code == 0, (flag, r.output)
            got = jsonl(r.stdout)
            if flag == "--top-n":
                assert got == plain[:2]
            # the logits, ranked alike, whose sigmoid is the plain score
            elif flag == "--raw-scores" and not late:
                assert [x["index"] for x in got] == [x["index"] for x in plain]
                assert all(abs(1 / (1 + 2.718281828459045 ** -g["score"]) - p["score"]) < 1e-5
                           for g, p in zip(got, plain))
            else:
                assert got == plain, flag

    # index, on every bundle: the two embedding kinds build, the rest are refused
    ix: dict[str, Path] = {}
    for task in TASKS:
        out = tmp_path / f"ix-{task}"
        base = ["index", str(bundles[task]), "--corpus", str(records), "--out", str(out), "--id-column",
                "doc",
                "--text-column", "body", "--json"]
        r = runner.invoke(app, base)
        if task not in ("embedding", "sparse-embedding", "colbert"):
            one_red_line(r, str(bundles[task]))
            continue
        assert r.exit_code == 0 and json.loads(r.stdout)["count"] == len(DOCS), r.output
        ix[task] = out
        sparse, late = task == "sparse-embedding", task == "colbert"
        flags: dict[str, list[str] | None] = {
            "--corpus": [], "--out": [], "--id-column": [], "--text-column": [], "--json": [],
            "--quantization": ["--quantization", "int8"], "--ann": ["--ann", "hnsw"],
            "--rescore-copy": ["--quantization", "int8", "--rescore-copy", "float16"],
            "--append": None, "--resume": None,  # below, on the index just built
            "--window": ["--window", "2"], "--workers": ["--workers", "1"], "--threads": ["--threads", "1"],
            "--batch-size": ["--batch-size", "2"], "--device": ["--device", "cuda"],
            "--engine": ["--engine", "local"],
            "--address": None,  # refused without --engine ray (the partner test)
            "--precision": ["--precision", "auto"], "--bits": ["--bits", "1"],
            "--delete": None, "--upsert": None, "--compact": None,  # below, on a copy of the index just built
            "--chunk-tokens": ["--chunk-tokens", "4"],
            "--chunk-overlap": ["--chunk-tokens", "4", "--chunk-overlap", "1"],
            "--chunk-sentences": ["--chunk-tokens", "4", "--chunk-sentences"],
            "--prompt-name": ["--prompt-name", "document"], "--dimensions": ["--dimensions", "4"],
        }
        for flag in walk("index", flags):
            if not flags[flag]:
                continue
            other = tmp_path / f"ix-{task}{flag}"
            r = runner.invoke(app, [*base[:5], str(other), *base[6:], *flags[flag]])
            if sparse and flag in ("--quantization", "--ann", "--rescore-copy"):
                one_red_line(r, flag, "sparse")
                continue
            if late and flag in ("--quantization", "--ann", "--rescore-copy"):
                one_red_line(r, flag, "colbert")
                continue
            if not late and flag == "--bits":
                one_red_line(r, "--bits is for a colbert bundle's index")
                continue
            if (sparse or late) and flag in ("--prompt-name", "--dimensions"):  # the embedding task's options
                one_red_line(r, flag, "has no")
                continue
            assert r.exit_code == 0, (flag, r.output)
            m = json.loads(r.stdout)
            if flag == "--dimensions":
                assert m["dims"] == 4 and m["count"] == len(DOCS), m
                continue
            # a row a chunk: more rows than documents, each searched as its document
            if flag.startswith("--chunk"):
                assert m["count"] > len(DOCS) and Index.open(other).manifest["chunks"]["tokens"] == 4, (flag,
                                                                                                        m)
                continue
            assert m["count"] == len(DOCS), (flag, m)
            if flag in ("--quantization", "--rescore-copy"):
                assert m["quantization"] == "int8"
            if flag == "--ann":
                assert m["ann"] == "hnsw"
        r = runner.invoke(app, ["index", str(bundles[task]), "--corpus", str(more), "--out", str(out),
                                "--append", "--json"])
        assert r.exit_code == 0 and json.loads(r.stdout)["count"] == len(DOCS) + 2, r.output
        # a finished build: nothing to continue (it added the corpus again)
        r = runner.invoke(app, [*base, "--resume"])
        one_red_line(r, "--resume: no unfinished build")
        assert Index.open(out).count == len(DOCS) + 2
        live = tmp_path / f"live-{task}"  # --upsert (m0 and m1 again), --delete, --compact
        shutil.copytree(out, live)
        (tmp_path / "gone.txt").write_text("m0\nd1\n")
        for argv, count, deleted in ((["--upsert", str(more)], len(DOCS) + 4, 2),
                                     (["--delete", str(tmp_path / "gone.txt")], len(DOCS) + 4, 4),
                                     (["--compact"], len(DOCS), 0)):
            r = runner.invoke(app, ["index", str(live), *argv, "--json"])
            assert (r.exit_code == 0 and (json.loads(r.stdout)["count"], json.loads(r.stdout)["deleted"])
                    == (count, deleted)), (argv, r.output)
        assert Index.open(live).live == len(DOCS)

    # search, on both indexes
    for task, index in ix.items():
        base = ["search", str(index), "where did john go", "--json"]
        r = runner.invoke(app, base)
        plain = jsonl(r.stdout)
        assert len(plain) == 1 and plain[0]["hits"], r.output
        flags = {"--input": ["--input", str(queries), "--text-column", "q"], "--text-column": None,
                 "--json": [],
                 "--top-k": ["--top-k", "2"], "--rescore": ["--rescore", "4"],
                 "--bundle": ["--bundle", str(bundles[task])],
                 "--export": ["--export", str(tmp_path / f"{task}.parquet")], "--batch": ["--batch", "1"],
                 "--precision": ["--precision", "fp32"],
                 # fused with itself (one corpus), each retriever's ranking the same: the plain hits' order
                 "--hybrid": ["--hybrid", str(index)],
                 "--fusion": ["--hybrid", str(index), "--fusion", "weighted"],
                 "--weights": ["--hybrid", str(index), "--weights", "1,2"],
                 "--corpus": ["--hybrid", "bm25", "--corpus", str(every), "--id-column", "doc",
                              "--corpus-column", "body"],
                 "--id-column": None, "--corpus-column": None, "--where": ["--where", "id in d1,d2,m0"],
                 "--chunk-agg": ["--chunk-agg", "max"],  # the others need a chunked index (test_index.py)
                 "--prompt-name": ["--prompt-name", "query"]}  # the query prompt by its name: the plain hits
        for flag in walk("search", flags):
            if flags[flag] is None:
                continue
            argv = (base[:2] if flag == "--input" else base) + flags[flag]
            r = runner.invoke(app, argv)
            if flag == "--rescore":  # a flat index is searched in one stage, a sparse one exactly
                one_red_line(r, "--rescore")
                continue
            if flag == "--prompt-name" and task != "embedding":
                one_red_line(r, flag, "has no")
                continue
            assert r.exit_code == 0, (flag, r.output)
            if flag == "--where":
                assert ({h["id"] for h in jsonl(r.stdout)[0]["hits"]} <= {"d1", "d2", "m0"}
                        and jsonl(r.stdout)[0]["hits"]), r.output
                continue
            if flag in ("--hybrid", "--fusion", "--weights", "--corpus"):
                ids = [h["id"] for h in jsonl(r.stdout)[0]["hits"]]
                assert (ids == [h["id"] for h in plain[0]["hits"]] if flag != "--corpus" else 0 < len(ids)
                        == len(set(ids))), (flag, ids)
                continue
            if flag == "--export":
                assert pq.read_table(tmp_path / f"{task}.parquet").num_rows == len(DOCS) + 2
                continue
            got = jsonl(r.stdout)
            if flag == "--input":
                assert [g["query"] for g in got] == ["where did john go", "a cat"]
                same_hits(got[0]["hits"], plain[0]["hits"])
            elif flag == "--top-k":
                same_hits(got[0]["hits"], plain[0]["hits"][:2])
            else:
                assert len(got) == 1, flag
                same_hits(got[0]["hits"], plain[0]["hits"])
