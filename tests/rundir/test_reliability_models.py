"""What a model is made of is checked before anything is built on it. One section per class:

1. a checkpoint's config.json, field by field and against the shapes its weights' headers declare
   (every family), before a module is allocated;
2. a bundle's mlmkit.json, field by field, against its graph's outputs and against the label order
   the graph records;
3. --resume passes over a damaged checkpoint to the newest that loads whole.

Every user error is exit status 2 and one line on stderr (hostile.one_line)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch
from conftest import make_base_model, run_export
from hostile import PEAK, cli, data_fixture, one_line, tiny  # noqa: F401  (data_fixture: the fixture `data`)
from task_runs import corpus, make_task_run

from mlmkit.errors import BundleError, ConfigError
from mlmkit.models import FAMILIES
from mlmkit.models.config import CEILINGS, ModelConfig
from mlmkit.models.core import BertForPreTraining
from mlmkit.models.presets import preset
from mlmkit.rundir.checkpoint import save_weights
from mlmkit.rundir.config import load_config, save_config
from mlmkit.rundir.weights import weight_files
from mlmkit.runtime.bundle import LABELS_KEY
from mlmkit.runtime.pipeline import Pipeline
from mlmkit.train.state import ResumeCheckpoints, _load_state, latest_checkpoint

FAMILY_NAMES = [f.model_types[0] for f in FAMILIES]


def family_dir(root: Path, arch: str, weights: str = "safetensors") -> Path:
    """A tiny randomly initialised model of ``arch`` (config.json + weights; no tokenizer needed)."""
    d = root / arch
    d.mkdir(parents=True)
    # (DeBERTa's 256 buckets need more than 2 x 64)
    positions = {"roberta": 66, "deberta-v2": 512}.get(arch, 64)
    cfg = preset("tiny", arch, vocab_size=100, max_position_embeddings=positions)
    cfg.architectures = ["BertForPreTraining"]
    torch.manual_seed(0)
    model = BertForPreTraining(cfg)
    save_weights(model, d / "model.safetensors", cfg)
    if weights != "safetensors":  # a transformers-era pickle: zip (torch >= 1.6) or the legacy format
        from safetensors.torch import load_file

        sd = load_file(str(d / "model.safetensors"))
        torch.save(sd, d / "pytorch_model.bin", _use_new_zipfile_serialization=weights == "bin-zip")
        (d / "model.safetensors").unlink()
    save_config(cfg, d / "config.json")
    return d


def edit_config(d: Path, **fields: Any) -> Path:
    p = d / "config.json"
    p.write_text(json.dumps({**json.loads(p.read_text()), **fields}))
    return p


def key_of(arch: str, field: str) -> str:
    """The field as the family's config.json spells it (DistilBERT's n_layers ...)."""
    fam = next(f for f in FAMILIES if arch in f.model_types)
    return fam.config_aliases.get(field, field)


def in_fresh_process(args: list[str | Path], timeout: float = 120) -> tuple[int, str, float, float]:
    """(exit status, stderr, seconds, peak resident MB) of `mlmkit ARGS` in a fresh interpreter."""
    code = (f"import sys\nfrom mlmkit.cli import main\nsys.argv = ['mlmkit', *{[str(a) for a in args]!r}]\n"
            "try:\n    main()\n    rc = 0\nexcept SystemExit as e:\n    rc = e.code\nprint('rc', "
            f"rc)\n{PEAK}")
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    secs = time.perf_counter() - t0
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) >= 2 and lines[-2].startswith("rc "), (r.returncode, r.stdout,
                                                                                   r.stderr[-3000:])
    return int(lines[-2].split()[1]), r.stderr, secs, float(lines[-1]) / 1024


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {arch: family_dir(root, arch) for arch in FAMILY_NAMES}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    base = make_base_model(root / "base", corpus())
    return {"fill-mask": base,
            "classification": make_task_run(base, "classification", root / "classification")}


@pytest.fixture(scope="module")
def bundles(runs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bundles")
    for kind, run in runs.items():
        run_export(run, root / kind)
    return {kind: root / kind for kind in runs}


# ---- 1. checkpoints are checked before they are built ------------------------------------------------
@pytest.mark.parametrize("arch", FAMILY_NAMES)
@pytest.mark.parametrize("field, value", [
    ("vocab_size", 500_000), ("num_hidden_layers", 200), ("hidden_size", 4096), ("intermediate_size", 60_000),
])
def test_config_sizes_are_checked_against_the_weights_of_every_family(
    tmp_path: Path, families: dict[str, Path], arch: str, field: str, value: int
) -> None:
    """Within the ceilings, but not these weights: refused from the headers, naming the file and the
    field as the family's config.json spells it."""
    d = Path(shutil.copytree(families[arch], tmp_path / arch))
    load_config(d)  # as saved: loads
    p = edit_config(d, **{key_of(arch, field): value})
    with pytest.raises(ConfigError) as e:
        load_config(d)
    msg = e.value.message
    assert (msg.startswith(f"{p}: {key_of(arch, field)} {value} does not match the weights")
            and "model.safetensors" in msg), msg


@pytest.mark.parametrize("arch, edits, what", [
    ("bert", {"max_position_embeddings": 100_000}, "the position embeddings have 64 rows"),
    ("roberta", {"max_position_embeddings": 100_000}, "the position embeddings have 66 rows"),
    ("bert", {"type_vocab_size": 1000}, "the token type embeddings have 2 rows"),
    ("electra", {"type_vocab_size": 1000}, "the token type embeddings have 2 rows"),
    ("deberta-v2", {"position_buckets": 100_000, "max_relative_positions": 131_072},
     "the relative position embeddings have 512 rows"),
    ("electra", {"embedding_size": 4096}, "the word embeddings have 128 columns"),
])
def test_tables_that_are_not_the_weights_are_refused(
    tmp_path: Path, families: dict[str, Path], arch: str, edits: dict[str, int], what: str
) -> None:
    d = Path(shutil.copytree(families[arch], tmp_path / arch))
    p = edit_config(d, **edits)
    field, value = next(iter(edits.items()))
    with pytest.raises(ConfigError, match=f"{field} {value} does not match the weights "
                                          f"\\(model.safetensors\\): {what}") as e:
        load_config(d)
    assert e.value.message.startswith(str(p))


@pytest.mark.parametrize("field, value", [
    ("vocab_size", 10**9), ("max_position_embeddings", 10**9), ("type_vocab_size", 10**9),
    ("num_hidden_layers", 10**5),
    ("hidden_size", 10**6), ("intermediate_size", 10**7),
])
def test_sizes_beyond_any_encoder_are_refused_whatever_the_weights(tmp_path: Path, families: dict[str, Path],
                                                                    field: str, value: int) -> None:
    d = Path(shutil.copytree(families["bert"], tmp_path / "m"))
    p = edit_config(d, **{field: value, **({"num_attention_heads": 2} if field == "hidden_size" else {})})
    with pytest.raises(ConfigError, match=f"^{p}: config {field} {value} is beyond what any encoder has "
                                          f"\\(at most {CEILINGS[field]:,}\\)"):
        load_config(d)


def test_sizes_each_within_their_ceiling_but_too_many_parameters_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="about 1100 billion parameters, beyond any encoder"):
        ModelConfig(hidden_size=16384, num_attention_heads=16, intermediate_size=65536, num_hidden_layers=256)


@pytest.mark.parametrize("arch, key, value, message", [
    ("bert", "hidden_dropout_prob", 1.5,
     "config hidden_dropout_prob must be a probability from 0 up to (not including) 1, got 1.5"),
    ("bert", "attention_probs_dropout_prob", -0.1,
     "config attention_probs_dropout_prob must be a probability"),
    ("bert", "hidden_dropout_prob", "0.1", "config hidden_dropout_prob must be a probability"),
    ("distilbert", "dropout", 1.0, "config dropout must be a probability"),
    ("modernbert", "attention_dropout", 2, "config attention_dropout must be a probability"),
    ("bert", "classifier_dropout", 7, "config classifier_dropout must be a probability"),
    ("deberta-v2", "pooler_dropout", "high", "config pooler_dropout must be a probability"),
    ("bert", "layer_norm_eps", 0, "config layer_norm_eps must be a positive number, got 0"),
    ("modernbert", "norm_eps", -1e-5, "config norm_eps must be a positive number"),
    ("bert", "layer_norm_eps", None, "config layer_norm_eps must be a positive number, got None"),
    ("bert", "initializer_range", -0.02, "config initializer_range must be a number, 0 or more"),
    ("bert", "vocab_size", 0, "config vocab_size must be a positive integer, got 0"),
    ("bert", "hidden_size", 64.0, "config hidden_size must be a positive integer, got 64.0"),
    ("distilbert", "n_heads", True, "config n_heads must be a positive integer, got True"),
    ("bert", "type_vocab_size", -1, "config type_vocab_size must be a whole number, 0 or more"),
    ("bert", "num_attention_heads", 3, "hidden_size 128 is not a multiple of num_attention_heads 3"),
    ("bert", "hidden_act", "swish2", "unsupported hidden_act 'swish2'"),
    ("modernbert", "hidden_activation", ["gelu"], "unsupported hidden_activation ['gelu']"),
    ("bert", "pad_token_id", 100, "config pad_token_id must be a token id from 0 to 99, got 100"),
    ("roberta", "pad_token_id", None, "config pad_token_id must be a token id from 0 to 99, got None"),
    ("bert", "architectures", "BertModel", "config architectures must be a list of class names"),
    ("bert", "model_type", 7, "model_type"),
    ("bert", "id2label", {"zero": "a"}, "config id2label key 'zero' is not a label id"),
    ("bert", "id2label", {"0": "a", "2": "b"}, "config id2label must number its labels 0 to n - 1"),
    ("bert", "id2label", {"0": "a", "1": "a"}, "config id2label must give each label a name of its own"),
    ("bert", "id2label", ["a", "b"], "config id2label must map label ids to names"),
    ("electra", "embedding_size", 0,
     "config embedding_size must be a positive integer of at most 16,384, got 0"),
    ("deberta-v2", "max_relative_positions", 10**9,
     "config max_relative_positions must be a positive integer"),
    ("modernbert", "local_attention", "wide", "config local_attention must be a positive integer"),
    ("modernbert", "local_attention", 0, "config local_attention must be a positive integer"),
    ("modernbert", "local_attention", -2, "config local_attention must be a positive integer"),
    ("modernbert", "local_attention", 7,
     "config local_attention must be even (half of the window on each side), got 7"),
    ("modernbert", "global_attn_every_n_layers", 0,
     "config global_attn_every_n_layers must be a positive integer"),
    ("modernbert", "global_rope_theta", 0,
     "config rope_theta of full_attention layers must be a positive number, got 0"),
    ("modernbert", "global_rope_theta", float("nan"),
     "config rope_theta of full_attention layers must be a positive number, got nan"),
    ("deberta-v2", "position_buckets", 0, "does not match the weights"),
    ("deberta-v2", "pos_att_type", ["c2p", "zzz"], "pos_att_type 'zzz' is not supported for deberta-v2"),
    ("roberta", "pad_token_id", 10**6, "config pad_token_id must be a token id from 0 to 99, got 1000000"),
    ("distilbert", "n_heads", 3, "hidden_size 128 is not a multiple of num_attention_heads 3"),
])
def test_every_config_field_is_typed_and_ranged_in_one_line(
    tmp_path: Path, families: dict[str, Path], arch: str, key: str, value: Any, message: str
) -> None:
    d = Path(shutil.copytree(families[arch], tmp_path / arch))
    p = edit_config(d, **{key: value})
    with pytest.raises(ConfigError) as e:
        load_config(d)
    assert e.value.message.startswith(f"{p}: ") and message in e.value.message, e.value.message
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("arch, claim", [("bert", "roberta"), ("roberta", "bert"), ("distilbert", "bert"),
                                         ("modernbert", "electra")])
def test_weights_of_another_family_than_config_json_names_are_refused(tmp_path: Path,
                                                                      families: dict[str, Path],
                                                                     arch: str, claim: str) -> None:
    """A BERT checkpoint whose config.json says roberta fine-tuned and exported before (exit 0), its
    weights loaded into RoBERTa's blocks."""
    from mlmkit.rundir.checkpoint import load_state_dict

    d = Path(shutil.copytree(families[arch], tmp_path / arch))
    edit_config(d, model_type=claim)
    with pytest.raises(ConfigError,
                       match=f"config.json says model_type '{claim}', but the weights are a {arch} model's"):
        load_state_dict(d, load_config(d))


def test_num_labels_has_a_ceiling(tmp_path: Path, families: dict[str, Path]) -> None:
    d = Path(shutil.copytree(families["bert"], tmp_path / "m"))
    edit_config(d, architectures=["BertForSequenceClassification"], num_labels=10**9)
    with pytest.raises(ConfigError, match="config num_labels must be a positive integer of at most 65,536, "
                                          "got 1000000000"):
        load_config(d)


def test_a_pickle_checkpoint_keeps_the_ceilings_and_a_zip_one_its_shapes(tmp_path: Path) -> None:
    legacy = family_dir(tmp_path / "a", "bert", weights="bin-legacy")
    assert [f.name for f in weight_files(legacy)] == ["pytorch_model.bin"]
    edit_config(legacy, vocab_size=500_000)
    load_config(legacy)  # no header to read: the loader's shape check finds it when it loads the weights
    edit_config(legacy, vocab_size=10**9)
    with pytest.raises(ConfigError, match="config vocab_size 1000000000 is beyond what any encoder has"):
        load_config(legacy)
    mapped = family_dir(tmp_path / "b", "bert", weights="bin-zip")
    edit_config(mapped, vocab_size=500_000)
    with pytest.raises(ConfigError,
                       match="vocab_size 500000 does not match the weights \\(pytorch_model.bin\\): the word "
                             "embeddings have 100 rows"):
        load_config(mapped)


def test_a_truncated_or_headerless_safetensors_file_is_one_line(tmp_path: Path,
                                                                families: dict[str, Path]) -> None:
    d = Path(shutil.copytree(families["bert"], tmp_path / "m"))
    w = d / "model.safetensors"
    w.write_bytes(w.read_bytes()[:-100])
    with pytest.raises(ConfigError, match="model.safetensors: truncated weights"):
        load_config(d)
    w.write_bytes((10**12).to_bytes(8, "little") + b"{}")  # a header length of a terabyte
    with pytest.raises(ConfigError,
                       match="model.safetensors: unreadable weights \\(no valid safetensors header\\)"):
        load_config(d)


@pytest.mark.parametrize("command", ["finetune", "export", "evaluate"])
def test_every_command_that_loads_a_checkpoint_checks_it_first(tmp_path: Path, runs: dict[str, Path],
                                                               command: str) -> None:
    m = Path(shutil.copytree(runs["classification"], tmp_path / "m"))
    edit_config(m, vocab_size=500_000)
    (tmp_path / "t.csv").write_text("text,label\na cat,pos\na dog,neg\n")
    args = {"finetune": ["finetune", "classification", "--model", m, "--train", tmp_path / "t.csv", "--out",
                         tmp_path / "o"],
            "export": ["export", m, "--out", tmp_path / "o"],
            "evaluate": ["evaluate", m, "--data", tmp_path / "t.csv"]}[command]
    one_line(cli(*args),
             f"{m / 'config.json'}: vocab_size 500000 does not match the weights (model.safetensors): "
             "the word embeddings have")


@pytest.mark.parametrize("command, edit", [
    ("export", {"hidden_size": 10**6}),  # the issue's: beyond the ceiling
    # within the ceilings: 4 billion parameters, 16 GB
    ("export", {"vocab_size": 1_000_000, "hidden_size": 4096}),
    # 17 billion: 67 GB
    ("finetune", {"num_hidden_layers": 100, "hidden_size": 4096, "intermediate_size": 8192}),
])
def test_an_inflated_checkpoint_fails_fast_and_small(tmp_path: Path, runs: dict[str, Path], command: str,
                                                     edit: dict[str, int]) -> None:
    m = Path(shutil.copytree(runs["fill-mask"], tmp_path / "m"))
    edit_config(m, **edit)
    (tmp_path / "t.csv").write_text("text,label\na cat,pos\na dog,neg\n")
    args = (["export", m, "--out", tmp_path / "o"] if command == "export" else
            ["finetune", "classification", "--model", m, "--train", tmp_path / "t.csv", "--out",
             tmp_path / "o"])
    rc, err, secs, mb = in_fresh_process(args)
    assert rc == 2 and "config.json" in err and "Traceback" not in err, err
    # ~4 s and ~260 MB (torch itself); built first, 16-256 GB or died
    assert secs < 20 and mb < 500, (secs, mb)


# ---- 2. a bundle's mlmkit.json is checked, field by field, against its graph -----------------------
def copy_bundle(bundles: dict[str, Path], kind: str, to: Path, **fields: Any) -> Path:
    b = Path(shutil.copytree(bundles[kind], to))
    meta = json.loads((b / "mlmkit.json").read_text())
    for k, v in fields.items():
        if "." in k:
            outer, inner = k.split(".")
            meta[outer] = {**meta[outer], inner: v}
        else:
            meta[k] = v
    (b / "mlmkit.json").write_text(json.dumps(meta))
    return b


@pytest.mark.parametrize("kind, option, value, said", [
    ("fill-mask", "candidates", "x", "expects a value of type int"),
    ("classification", "threshold", "high", "expects a value of type float"),
    ("fill-mask", "candidates", 0, "must be at least 1"),
])
def test_a_bundles_saved_task_options_are_checked_when_it_loads(tmp_path: Path, bundles: dict[str, Path],
                                                                kind: str, option: str, value: Any,
                                                                said: str) -> None:
    b = copy_bundle(bundles, kind, tmp_path / "b", **{f"options.{option}": value})
    with pytest.raises(ConfigError) as e:
        Pipeline.load(b)
    assert f"saved task option '{option}'" in e.value.message and said in e.value.message, e.value.message
    assert "\n" not in str(e.value)


def test_export_records_the_label_order_in_the_graph(bundles: dict[str, Path]) -> None:
    for kind, labels in (("classification", ["neg", "pos"]), ("fill-mask", None)):
        props = {p.key: p.value for p in onnx.load(str(bundles[kind] / "model.onnx"),
                                                   load_external_data=False).metadata_props}
        assert json.loads(props[LABELS_KEY]) == labels
        Pipeline.load(bundles[kind])


def test_reordered_labels_are_refused(tmp_path: Path, bundles: dict[str, Path]) -> None:
    """Same count, other order: every answer would carry the other label's name."""
    b = copy_bundle(bundles, "classification", tmp_path / "b", labels=["pos", "neg"])
    with pytest.raises(BundleError,
                       match=r"mlmkit.json: its 'labels' \['pos', 'neg'\] are not the labels the model was "
                             r"trained with, in that order \(\['neg', 'pos'\], recorded in "
                             r"model.onnx\)"):
        Pipeline.load(b)
    one_line(cli("classify", b, "a cat"), "are not the labels the model was trained with")
    renamed = copy_bundle(bundles, "classification", tmp_path / "c", labels=["neg", "positive"])
    with pytest.raises(BundleError, match="are not the labels the model was trained with"):
        Pipeline.load(renamed)


def strip_recorded_labels(b: Path) -> None:
    """The bundle as export wrote it before it recorded the label order."""
    model = onnx.load(str(b / "model.onnx"))
    kept = [p for p in model.metadata_props if p.key != LABELS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    onnx.save(model, str(b / "model.onnx"))


def test_a_bundle_from_before_the_recorded_order_still_loads_with_its_count_check(
        tmp_path: Path, bundles: dict[str, Path]) -> None:
    old = copy_bundle(bundles, "classification", tmp_path / "old")
    strip_recorded_labels(old)
    assert Pipeline.load(old)(["a cat"])[0]["label"] in ("neg", "pos")
    bad = copy_bundle(bundles, "classification", tmp_path / "bad", labels=["neg", "pos", "other"])
    strip_recorded_labels(bad)
    with pytest.raises(BundleError, match="lists 3 labels but the model's 'logits' has 2"):
        Pipeline.load(bad)


@pytest.mark.parametrize("kind, fields, message", [
    ("classification", {"labels": ["neg", "neg"]}, "'labels' names a label twice"),
    ("classification", {"labels": [0, 1]}, "'labels' is not a list of names"),
    ("classification", {"labels": []}, "'labels' is not a list of names"),
    ("classification", {"tokenizer.pad_id": -1},
     "'tokenizer.pad_id' or 'tokenizer.mask_id' is not a token id"),
    ("classification", {"tokenizer.mask_id": 10**6},
     "'tokenizer.pad_id' or 'tokenizer.mask_id' is not a token id"),
    ("classification", {"tokenizer.vocab_size": "big"},
     "'tokenizer.vocab_size' is not a positive number of tokens"),
    ("classification", {"tokenizer.lowercase": "yes"}, "'tokenizer.lowercase' not true / false"),
    ("classification", {"model": [1, 2]}, "'model' is not an object of the model's sizes"),
    ("classification", {"model.hidden_size": 0}, "'model' is not an object of the model's sizes"),
    ("classification", {"max_length": 10**9},
     "'max_length' 1000000000 is not a whole number of tokens from 1 to"),
    ("classification", {"inputs": ["input_ids", "pixels"]}, "'inputs' is not a list of the graph inputs"),
    ("classification", {"inputs": ["attention_mask"]}, "'inputs' is not a list of the graph inputs"),
    ("classification", {"outputs": {"logits": []}}, "'outputs' does not map names to axis lists"),
    ("classification", {"precision": "fp64"}, "'precision' is not one of fp32, int8, fp16"),
    ("classification", {"opset": "17"}, "'opset' is not an ONNX opset number"),
    ("classification", {"options": []}, "'options' is not an object"),
    ("classification", {"task": ""}, "'task' is not a name"),
    ("classification", {"format": "other"}, "'format' is not mlmkit-onnx-bundle"),
    ("classification", {"optimizations": "all"}, "'optimizations' is not a list of names"),
    ("fill-mask", {"outputs": {"mask_positions": ["masks", "coordinate"], "top_ids": ["masks", "k"],
                               "top_probs": ["masks", "k"]}}, "is a fill-mask bundle of an earlier layout"),
])
def test_every_bundle_field_is_typed_and_ranged_in_one_line(tmp_path: Path, bundles: dict[str, Path],
                                                            kind: str,
                                                             fields: dict[str, Any], message: str) -> None:
    b = copy_bundle(bundles, kind, tmp_path / "b", **fields)
    with pytest.raises(BundleError) as e:
        Pipeline.load(b)
    assert e.value.message.startswith(f"{b / 'mlmkit.json'}: " if "earlier" not in message else f"{b} ")
    assert message in e.value.message, e.value.message
    one_line(cli("classify" if kind == "classification" else "fill-mask", b, "a [MASK] cat"), message)


def test_declared_axes_must_be_the_graphs(tmp_path: Path, bundles: dict[str, Path]) -> None:
    b = copy_bundle(bundles, "classification", tmp_path / "b",
                    outputs={"logits": ["batch", "sequence", "label"]})
    with pytest.raises(BundleError,
                       match=r"its 'outputs' give 'logits' the axes \['batch', 'sequence', 'label'\], "
                             r"but the model's 'logits' has 2"):
        Pipeline.load(b)
    fm = copy_bundle(bundles, "fill-mask", tmp_path / "fm",
                     outputs={"indices": ["batch", "sequence", "terms"],
                              "values": ["batch", "sequence", "terms"]})
    with pytest.raises(BundleError,
                       match="is described as a fill-mask bundle, but its outputs .* are not the task's"):
        Pipeline.load(fm)


def edit_graph_output(b: Path, name: str, *, elem_type: int | None = None, dim0: int | None = None) -> None:
    """Change what the graph declares of one output: its element type (a Cast in front) or its first
    dimension."""
    model = onnx.load(str(b / "model.onnx"))
    out = next(o for o in model.graph.output if o.name == name)
    if elem_type is not None:
        for node in model.graph.node:
            node.output[:] = [f"{name}_raw" if x == name else x for x in node.output]
        model.graph.node.append(onnx.helper.make_node("Cast", [f"{name}_raw"], [name], to=elem_type))
        out.type.tensor_type.elem_type = elem_type
    if dim0 is not None:
        out.type.tensor_type.shape.dim[0].dim_value = dim0
    onnx.save(model, str(b / "model.onnx"))


def test_graph_outputs_of_another_type_or_a_fixed_batch_are_refused(tmp_path: Path,
                                                                    bundles: dict[str, Path]) -> None:
    b = copy_bundle(bundles, "classification", tmp_path / "b")
    edit_graph_output(b, "logits", elem_type=onnx.TensorProto.INT64)
    with pytest.raises(BundleError, match=r"model.onnx: its output 'logits' is tensor\(int64\), the runtime "
                                          r"reads tensor\(float\)"):
        Pipeline.load(b)
    fm = copy_bundle(bundles, "fill-mask", tmp_path / "fm")
    edit_graph_output(fm, "values", elem_type=onnx.TensorProto.DOUBLE)
    with pytest.raises(BundleError, match=r"its output 'values' is tensor\(double\)"):
        Pipeline.load(fm)
    fixed = copy_bundle(bundles, "classification", tmp_path / "fixed")
    edit_graph_output(fixed, "logits", dim0=3)
    with pytest.raises(BundleError,
                       match="has a size of 3 along its 'batch' axis, whose size varies from run to run"):
        Pipeline.load(fixed)


# ---- 3. --resume falls back to the newest checkpoint that loads whole --------------------------------
@pytest.fixture(scope="module")
def finished(data, tmp_path_factory) -> Path:
    """A 4-step pretraining run, checkpoints at steps 2 and 4."""
    out = tmp_path_factory.mktemp("finished") / "run"
    r = cli(*tiny(data, out))
    assert r.exit_code == 0, r.output
    assert [p.name for p in ResumeCheckpoints(out, lambda *a: None, 2).complete()] == ["step-0000002",
                                                                                       "step-0000004"]
    return out


def damage(ck: Path, what: str) -> Path:
    p = {"optimizer": ck / "state" / "optimizer.pt", "rng": ck / "state" / "rng.pt",
         "weights": ck / "model.safetensors",
         "trainer": ck / "state" / "trainer.json", "config": ck / "config.json"}[what]
    data_ = p.read_bytes()
    p.write_bytes(data_[: len(data_) // 2])  # cut short, as by a full disk or a killed copy
    return p


@pytest.mark.parametrize("what", ["optimizer", "rng", "weights", "trainer", "config"])
def test_resume_passes_over_a_damaged_checkpoint_to_the_older_one(tmp_path: Path, data: dict[str, Path],
                                                                  finished: Path, what: str) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "run"))
    bad = damage(out / "checkpoints" / "step-0000004", what)
    r = cli(*tiny(data, out, "--resume"))
    assert r.exit_code == 0, r.output
    err = " ".join(r.stderr.split())
    assert f"passing over the checkpoint {out / 'checkpoints' / 'step-0000004'}: {bad}" in err, err
    assert (f"resuming from {out / 'checkpoints' / 'step-0000002'}, the newest checkpoint that loads "
            "whole") in err, err
    assert "weights_only" not in r.output and "Traceback" not in r.output
    from safetensors.torch import load_file

    # steps 3 and 4 again from step 2's state: the very weights of the run that was never interrupted
    a, b = load_file(str(finished / "model.safetensors")), load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_resume_with_no_checkpoint_that_loads_is_one_line(tmp_path: Path, data: dict[str, Path],
                                                          finished: Path) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "run"))
    damage(out / "checkpoints" / "step-0000004", "optimizer")
    damage(out / "checkpoints" / "step-0000002", "rng")
    text = one_line(cli(*tiny(data, out, "--resume")), "--resume: none of the 2 checkpoints", "loads whole",
                    "step-0000004/state/optimizer.pt: unreadable (damaged or truncated)")
    assert "weights_only" not in text


def test_a_damaged_state_file_is_named_without_unsafe_load_advice(tmp_path: Path, finished: Path) -> None:
    src = finished / "checkpoints" / "step-0000004" / "state" / "optimizer.pt"
    for name, content in (("cut.pt", src.read_bytes()[:5000]), ("noise.pt", b"\x80\x02garbage" * 50)):
        (tmp_path / name).write_bytes(content)
        with pytest.raises(ConfigError) as e:
            _load_state(tmp_path / name, torch.device("cpu"))
        assert str(e.value).startswith(f"{tmp_path / name}: unreadable (damaged or truncated)"), str(e.value)
        assert "weights_only" not in str(e.value)


def test_latest_checkpoint_is_the_newest_that_loads_whole(tmp_path: Path, finished: Path,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    out = Path(shutil.copytree(finished, tmp_path / "run"))
    assert latest_checkpoint(out).name == "step-0000004"
    damage(out / "checkpoints" / "step-0000004", "weights")
    assert latest_checkpoint(out).name == "step-0000002"
    damage(out / "checkpoints" / "step-0000002", "optimizer")
    assert latest_checkpoint(out) is None
    # complete, though damaged
    assert ResumeCheckpoints(out, lambda *a: None, 2).latest().name == "step-0000004"
    model = BertForPreTraining(load_config(finished / "checkpoints" / "step-0000002"))
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    logger = logging.getLogger("mlmkit")  # (the CLI stops it propagating to caplog's root handler)
    logger.addHandler(caplog.handler)
    try:
        with pytest.raises(ConfigError, match="none of the 2 checkpoints"):
            ResumeCheckpoints(out, lambda *a: None, 2).restore(model, opt, sched, torch.device("cpu"))
    finally:
        logger.removeHandler(caplog.handler)
    # the error says it all, in one line
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
