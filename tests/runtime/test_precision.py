"""Precision and engine per machine (mlmkit.runtime.precision, mlmkit.runtime.engines): auto's choice
with bf16 units forced on and off, the gate (measured, recorded in the bundle, held to a threshold),
every task's outputs through OpenVINO in bf16, and the refusals (the CPU's flags: test_engines.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import run_export
from task_runs import corpus

from mlmkit.errors import BundleError, ConfigError, ParityError
from mlmkit.runtime import precision as precision_mod
from mlmkit.runtime.engines import ENGINES, cpu_feature
from mlmkit.runtime.pipeline import Pipeline

NO_BF16 = "-amx_bf16,-avx512_bf16"
BF16 = "+amx_bf16"
have_openvino = ENGINES["openvino"].missing() is None
needs_openvino = pytest.mark.skipif(not have_openvino,
                                    reason="OpenVINO is not installed (pip install 'mlmkit[openvino]')")


@pytest.fixture(scope="module")
def bundles(task_bundles):
    return task_bundles


@pytest.fixture
def copy(bundles, tmp_path):
    def make(kind: str):
        d = tmp_path / kind
        shutil.copytree(bundles[kind], d)
        return d
    return make


# ---- auto's choice --------------------------------------------------------------------------------
def test_auto_without_bf16_units_stays_fp32_and_says_why(bundles, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", NO_BF16)
    pipe = Pipeline.load(bundles["classification"], precision="auto")
    assert (pipe.precision, pipe.choice.engine) == ("fp32", "onnxruntime")
    assert "bf16 not used: this CPU has no bf16 units (neither amx_bf16 nor avx512_bf16" in pipe.choice.why
    with pytest.raises(ConfigError, match="--precision bf16: this CPU has no bf16 units .*amx_bf16"):
        Pipeline.load(bundles["classification"], precision="bf16")


def test_auto_without_openvino_says_the_pip_command(bundles, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    monkeypatch.setattr(ENGINES["openvino"], "missing",
                        lambda: "OpenVINO is not installed (pip install 'mlmkit[openvino]')")
    pipe = Pipeline.load(bundles["embedding"], precision="auto")
    assert pipe.precision == "fp32" and "pip install 'mlmkit[openvino]'" in pipe.choice.why
    with pytest.raises(ConfigError, match=r"--precision bf16: OpenVINO is not installed \(pip install "
                                          r"'mlmkit\[openvino\]'\)"):
        Pipeline.load(bundles["embedding"], precision="bf16")


@pytest.mark.parametrize("error", [RuntimeError("libopenvino.so.2540: undefined symbol"),
                                   OSError(12, "no memory")])
def test_a_broken_openvino_install_falls_back_to_fp32_with_a_line(bundles, monkeypatch, error):
    """An OpenVINO whose import raises (a library it loads, a clash of versions) is no crash: auto stays
    in fp32 saying why, bf16 asked for is one line."""
    import builtins

    real = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise error
        return real(name, *args, **kwargs)

    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    monkeypatch.delitem(sys.modules, "openvino", raising=False)
    monkeypatch.setattr(builtins, "__import__", broken)
    said = f"OpenVINO is installed but does not import ({type(error).__name__}"
    assert said in ENGINES["openvino"].missing()
    pipe = Pipeline.load(bundles["embedding"], precision="auto")
    assert pipe.precision == "fp32" and said in pipe.choice.why
    with pytest.raises(ConfigError, match="--precision bf16: OpenVINO is installed but does not import"):
        Pipeline.load(bundles["embedding"], precision="bf16")


def test_the_environment_sets_the_default_and_a_bad_value_is_one_line(bundles, monkeypatch):
    monkeypatch.setenv("MLMKIT_PRECISION", "fp32")
    assert Pipeline.load(bundles["embedding"]).choice.why == "fp32 on onnxruntime: asked for"
    monkeypatch.setenv("MLMKIT_PRECISION", "bf17")
    with pytest.raises(ConfigError, match=r"\$MLMKIT_PRECISION bf17 is not a precision"):
        Pipeline.load(bundles["embedding"])


def test_a_bundle_runs_only_in_its_own_precision_when_it_is_not_fp32(runs, bundles, tmp_path, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    run_export(runs["classification"], tmp_path / "q", precision="int8")
    pipe = Pipeline.load(tmp_path / "q", precision="auto")
    assert (pipe.precision, pipe.choice.why) == ("int8", "int8 on onnxruntime: the bundle is int8")
    with pytest.raises(ConfigError, match="is an int8 bundle, which runs in int8 only"):
        Pipeline.load(tmp_path / "q", precision="bf16")
    with pytest.raises(ConfigError, match="--precision int8: .* is an fp32 bundle"):
        Pipeline.load(bundles["classification"], precision="int8")
    with pytest.raises(ConfigError, match="--precision fp16: .* is an fp32 bundle"):
        Pipeline.load(bundles["classification"], precision="fp16")


# ---- bf16 through OpenVINO ------------------------------------------------------------------------
@needs_openvino
@pytest.mark.parametrize("kind", ["fill-mask", "classification", "tagging", "qa", "embedding",
                                  "sparse-embedding", "rerank"])
def test_every_task_runs_in_bf16_through_openvino_near_fp32(kind, bundles, monkeypatch):
    """Each task's graph through OpenVINO in bf16 (forced where the CPU has no bf16 units: OpenVINO then
    computes in fp32), its outputs read by the same pipeline, close to onnxruntime's fp32. The gate is
    held low here (a tiny random reranker's scores hardly vary, and bf16's rounding is most of their
    spread: its correlation was 0.82 on AMX); the gate's own decisions are tested below."""
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    texts = corpus(12, seed=5)
    inputs = ([{"question": t[:20], "context": t} for t in texts] if kind == "qa"
              else [{"text": t, "text_pair": t[::-1]} for t in texts] if kind == "rerank"
              else [t.replace(t.split()[1], "[MASK]", 1) for t in texts] if kind == "fill-mask" else texts)
    fast = Pipeline.load(bundles[kind], precision="bf16", min_agreement=0.5)
    assert (fast.precision, fast.choice.engine, fast.providers) == ("bf16", "openvino",
                                                                    ["OpenVINO CPU (bf16)"]), fast.choice.why
    assert fast.choice.gate["passed"] and "its gate passed" in fast.choice.why
    ref = Pipeline.load(bundles[kind], precision="fp32")
    got, want = fast(inputs), ref(inputs)
    assert len(got) == len(want) and [sorted(g) for g in got] == [sorted(w) for w in want]
    if kind == "embedding":
        a, b = np.array([g["embedding"] for g in got]), np.array([w["embedding"] for w in want])
        assert (a * b).sum(1).min() > 0.99
    if kind == "fill-mask":
        assert [len(g["masks"]) for g in got] == [len(w["masks"]) for w in want]


@needs_openvino
def test_export_records_the_gate_and_its_sample_and_each_machine_measures_again(bundles, monkeypatch):
    meta = json.loads((bundles["embedding"] / "mlmkit.json").read_text())
    gate = meta["gate"]
    assert (len(gate["input_ids"]) == 24 and gate["on"] == "the sample batch" and meta["run_precision"]
            == "auto")
    if cpu_feature("bf16") is None:
        assert gate["bf16"]["passed"] is None and "no bf16 units" in gate["bf16"]["not_measured"]
    else:
        assert gate["bf16"]["passed"] and gate["bf16"]["measure"] == "mean cosine"
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    calls = []
    real = precision_mod.measure
    monkeypatch.setattr(precision_mod, "measure", lambda *a: calls.append(1) or real(*a))
    pipe = Pipeline.load(bundles["embedding"], precision="auto")
    assert (calls == [1] and pipe.precision == "bf16"
            and "24-input sample (the sample batch)" in pipe.choice.why)
    # a job's workers take their parent's gate: measured once per job, not once per worker
    again = Pipeline.load(bundles["embedding"], precision=pipe.precision, gate=pipe.choice.gate)
    assert calls == [1] and again.precision == "bf16"


@needs_openvino
def test_a_failing_gate_is_not_used_by_auto_and_refused_when_asked_for(copy, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    d = copy("classification")
    monkeypatch.setattr(precision_mod, "measure",
                        lambda *a: {"top1": 0.9, "cosine": None, "pearson": None, "value": 0.9,
                                    "measure": "top-1 agreement"})
    pipe = Pipeline.load(d, precision="auto")
    assert (pipe.precision == "fp32"
            and "bf16 not used: its gate failed here: top-1 agreement 0.9 < 0.99" in pipe.choice.why)
    with pytest.raises(ConfigError,
                       match="--precision bf16: its gate failed here: top-1 agreement 0.9 < 0.99"):
        Pipeline.load(d, precision="bf16")
    assert Pipeline.load(d, precision="bf16", min_agreement=0.8).precision == "bf16"  # the user's threshold
    # a gate recorded as failed at export: auto passes bf16 over without measuring
    meta = json.loads((d / "mlmkit.json").read_text())
    meta["gate"]["bf16"] = {"precision": "bf16", "measure": "top-1 agreement", "value": 0.5,
                            "threshold": 0.99,
                            "passed": False, "on": "24-input sample"}
    (d / "mlmkit.json").write_text(json.dumps(meta))
    monkeypatch.setattr(precision_mod, "measure",
                        lambda *a: pytest.fail("measured a gate recorded as failed"))
    pipe = Pipeline.load(d, precision="auto")
    assert (pipe.precision == "fp32"
            and "its gate failed at export: top-1 agreement 0.5 < 0.99" in pipe.choice.why)
    with pytest.raises(ConfigError, match="its gate failed at export"):
        Pipeline.load(d, precision="bf16")


@needs_openvino
def test_a_damaged_gate_sample_is_one_line(copy, bundles, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    d = copy("embedding")
    meta = json.loads((d / "mlmkit.json").read_text())
    meta["gate"]["input_ids"][3] = [10 ** 9]
    (d / "mlmkit.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match="mlmkit.json: 'gate' has no sample of token ids"):
        Pipeline.load(d, precision="auto")
    good = json.loads((bundles["embedding"] / "mlmkit.json").read_text())["gate"]
    longest = meta["max_length"] + 1
    for rows, types, said in ((good["input_ids"] * 20, good["token_type_ids"] * 20, "rows of up to"),
                              ([[5] * longest], [[0] * longest], "1 rows of up")):
        meta["gate"] = {**good, "input_ids": rows, "token_type_ids": types}  # it would run at every load
        (d / "mlmkit.json").write_text(json.dumps(meta))
        with pytest.raises(BundleError, match=f"'gate' holds .*{said}"):
            Pipeline.load(d, precision="auto")
    meta["gate"] = [1, 2]
    (d / "mlmkit.json").write_text(json.dumps(meta))
    with pytest.raises(BundleError, match="'gate' is not an object"):
        Pipeline.load(d, precision="fp32")


def test_export_pinned_to_fp32_runs_in_fp32_everywhere(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    run_export(runs["embedding"], tmp_path / "e", precision="fp32")
    pipe = Pipeline.load(tmp_path / "e", precision="auto")
    assert pipe.precision == "fp32" and "exported with --precision fp32" in pipe.choice.why


def test_export_bf16_where_it_cannot_be_measured_writes_nothing(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", NO_BF16)
    with pytest.raises(ConfigError,
                       match="--precision bf16: this CPU has no bf16 units .*; no bundle written"):
        run_export(runs["embedding"], tmp_path / "e", precision="bf16")
    assert not (tmp_path / "e" / "mlmkit.json").exists()
    with pytest.raises(ConfigError, match="--precision int8 and --fp16 disagree"):
        run_export(runs["embedding"], tmp_path / "e", precision="int8", fp16=True)


@needs_openvino
def test_export_bf16_whose_gate_fails_writes_nothing(runs, tmp_path, monkeypatch):
    from mlmkit.exporter import bundle as export_mod

    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    monkeypatch.setattr(export_mod, "measure",
                        lambda *a: {"top1": None, "cosine": 0.9, "pearson": None, "value": 0.9,
                                    "measure": "mean cosine"})
    with pytest.raises(ParityError, match="--precision bf16: its gate failed: mean cosine 0.9 < 0.999 .*; no "
                                          "bundle written"):
        run_export(runs["embedding"], tmp_path / "e", precision="bf16")
    assert not (tmp_path / "e" / "mlmkit.json").exists()
    # auto records the failure and goes on
    meta = run_export(runs["embedding"], tmp_path / "a", precision="auto")
    assert meta["gate"]["bf16"]["passed"] is False and meta["precision"] == "fp32"


def test_the_cli_refuses_bf16_in_one_line_naming_the_flag(bundles, tmp_path):
    import os

    env = {**os.environ, "MLMKIT_CPU_FLAGS": NO_BF16}
    r = subprocess.run([sys.executable, "-m", "mlmkit", "embed", str(bundles["embedding"]), "a text",
                        "--precision", "bf16"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "--precision bf16: this CPU has no bf16 units (neither amx_bf16 nor avx512_bf16" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not have_openvino or cpu_feature("bf16") is None,
                    reason="needs a CPU with bf16 units and OpenVINO")
def test_on_real_bf16_units_auto_computes_in_bf16(bundles, monkeypatch):
    """On this machine's own bf16 units: auto picks bf16, and its outputs differ from fp32's (it is not
    fp32 under another name) while the gate holds."""
    monkeypatch.delenv("MLMKIT_CPU_FLAGS", raising=False)
    pipe = Pipeline.load(bundles["embedding"], precision="auto")
    assert (pipe.precision == "bf16" and "this CPU has AMX-BF16" in pipe.choice.why
            or "AVX512-BF16" in pipe.choice.why)
    texts = corpus(16, seed=9)
    a = np.array([r["embedding"] for r in pipe(texts)])
    b = np.array([r["embedding"] for r in Pipeline.load(bundles["embedding"], precision="fp32")(texts)])
    assert not np.array_equal(a, b) and (a * b).sum(1).min() > 0.99


@needs_openvino
def test_openvino_runs_short_and_long_batches_each_on_its_compilation(bundles):
    """Batches up to SHORT_SEQUENCE tokens run without OpenVINO's fused attention, longer ones with it
    (compiled at the first long batch): both agree with onnxruntime (fp32 here, so closely)."""
    from mlmkit.runtime.engines import SHORT_SEQUENCE, OpenVinoSession, make_session

    ov_session = OpenVinoSession(bundles["embedding"] / "model.onnx", precision="fp32", threads=1)
    ref = make_session(bundles["embedding"] / "model.onnx", threads=1)
    rng = np.random.default_rng(0)
    vocab = json.loads((bundles["embedding"] / "mlmkit.json").read_text())["tokenizer"]["vocab_size"]
    for T in (12, SHORT_SEQUENCE, SHORT_SEQUENCE + 40):
        ids = rng.integers(5, vocab, size=(3, T))
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        (a,), (b,) = ov_session.run(["embedding"], feed), ref.run(["embedding"], feed)
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
        assert (ov_session.long is not None) == (T > SHORT_SEQUENCE)


def test_the_gate_sample_is_the_calibrate_inputs_where_given(runs, tmp_path):
    texts = tmp_path / "calib.txt"
    texts.write_text("\n".join(corpus(40, seed=3)) + "\n")
    meta = run_export(runs["embedding"], tmp_path / "q", precision="int8", calibrate=texts)
    gate = meta["gate"]
    assert gate["on"] == "40 --calibrate inputs" and len(gate["input_ids"]) == 32 and "bf16" not in gate
    # spread over the length-sorted batches, not the 32 shortest
    assert len({len(r) for r in gate["input_ids"]}) > 3


def test_a_graph_openvino_cannot_run_stays_fp32_under_auto_and_is_refused_as_bf16(bundles, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    monkeypatch.setattr(ENGINES["openvino"], "missing", lambda: None)

    def cannot(*a, **k):
        raise BundleError("OpenVINO cannot read model.onnx (OpConversionFailure: QAttention)",
                          "run it with --precision fp32")

    monkeypatch.setattr(ENGINES["openvino"], "open", cannot)
    pipe = Pipeline.load(bundles["classification"], precision="auto")
    assert (pipe.precision == "fp32"
            and "bf16 not used: OpenVINO cannot run it in bf16 (OpenVINO cannot read" in pipe.choice.why)
    with pytest.raises(ConfigError, match=r"--precision bf16: OpenVINO cannot run it in bf16 \(OpenVINO"):
        Pipeline.load(bundles["classification"], precision="bf16")


@needs_openvino
def test_a_recorded_gate_edited_out_of_shape_is_said_not_a_crash(copy, monkeypatch):
    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    d = copy("embedding")
    meta = json.loads((d / "mlmkit.json").read_text())
    meta["gate"]["bf16"] = {"passed": False}
    (d / "mlmkit.json").write_text(json.dumps(meta))
    pipe = Pipeline.load(d, precision="auto")
    assert (pipe.precision == "fp32"
            and "its record in mlmkit.json has no value and threshold" in pipe.choice.why)


def test_an_engine_failing_in_the_gate_is_named_onnxruntime_refused_openvino_stays_fp32(bundles, monkeypatch):
    """onnxruntime's own error running the fp32 reference on the gate's sample refuses the bundle in one
    line naming onnxruntime and fp32 (never OpenVINO); OpenVINO's, running bf16, leaves auto in fp32."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail
    from typer.testing import CliRunner

    from mlmkit.cli import app
    from mlmkit.runtime.engines import make_session

    class Failing:  # the session as it opens and is checked, failing when it runs
        def __init__(self, session, error):
            self.session, self.error = session, error

        def __getattr__(self, name):
            return getattr(self.session, name)

        def run(self, *a, **k):
            raise self.error

    monkeypatch.setenv("MLMKIT_CPU_FLAGS", BF16)
    monkeypatch.setattr(ENGINES["openvino"], "missing", lambda: None)
    monkeypatch.setattr(ENGINES["openvino"], "open", lambda model, **k: make_session(model))
    real = ENGINES["onnxruntime"].open
    fail = Fail("[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Gemm node.")
    monkeypatch.setattr(ENGINES["onnxruntime"], "open", lambda model, **k: Failing(real(model, **k), fail))
    said = r"onnxruntime cannot run it in fp32 \(Fail: Non-zero status code returned while running Gemm"
    for precision in ("auto", "bf16"):
        with pytest.raises(BundleError, match=said) as e:
            Pipeline.load(bundles["classification"], precision=precision)
        assert "OpenVINO" not in str(e.value) and "precision gate" in str(e.value)
    r = CliRunner().invoke(app, ["classify", str(bundles["classification"]), "a text", "--precision", "auto"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert len(r.stderr.strip().splitlines()) == 1 and "onnxruntime cannot run it in fp32" in r.stderr
    monkeypatch.setattr(ENGINES["onnxruntime"], "open", real)
    monkeypatch.setattr(ENGINES["openvino"], "open", lambda model, **k: Failing(
        make_session(model), RuntimeError("Exception from src/plugins/intel_cpu: no bf16 kernel")))
    pipe = Pipeline.load(bundles["classification"], precision="auto")
    assert (pipe.precision, pipe.choice.engine) == ("fp32", "onnxruntime")
    assert "bf16 not used: OpenVINO cannot run it in bf16 (Exception from" in pipe.choice.why
    with pytest.raises(ConfigError, match=r"--precision bf16: OpenVINO cannot run it in bf16 \(Exception"):
        Pipeline.load(bundles["classification"], precision="bf16")
