"""The command line, end to end, as a subprocess: inspect, rewrite, run, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from autobatch.tools import batch_one_graph, op_counts, random_feeds
from autobatch.ir import from_onnx
from tests.test_onnx_io import ort_run

D, H, K = 8, 16, 6


def autobatch_cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autobatch", *args], capture_output=True, text=True, timeout=timeout)


def lstm_copies_model(copies: int = K, rows: str = "1") -> onnx.ModelProto:
    """K copies of one LSTM cell on different inputs of ``rows`` rows, sharing the weights."""
    inputs, outputs, body = [], [], []
    for k in range(copies):
        inputs += [f"float[{rows}, {D}] x{k}", f"float[{rows}, {H}] h{k}", f"float[{rows}, {H}] c{k}"]
        outputs += [f"float[{rows}, {H}] hn{k}", f"float[{rows}, {H}] cn{k}"]
        body += [
            f"xw{k} = MatMul(x{k}, W)", f"hu{k} = MatMul(h{k}, U)", f"s{k} = Add(xw{k}, hu{k})", f"g{k} = Add(s{k}, B)",
            f"i{k}, f{k}, o{k}, u{k} = Split <axis = 1, num_outputs = 4> (g{k})",
            f"si{k} = Sigmoid(i{k})", f"sf{k} = Sigmoid(f{k})", f"so{k} = Sigmoid(o{k})", f"tu{k} = Tanh(u{k})",
            f"fc{k} = Mul(sf{k}, c{k})", f"iu{k} = Mul(si{k}, tu{k})", f"cn{k} = Add(fc{k}, iu{k})",
            f"tc{k} = Tanh(cn{k})", f"hn{k} = Mul(so{k}, tc{k})",
        ]
    text = (f'<ir_version: 9, opset_import: ["" : 18]>\ncells ({", ".join(inputs)}) => ({", ".join(outputs)})\n'
            f"<float[{D}, {4 * H}] W, float[{H}, {4 * H}] U, float[{4 * H}] B> {{\n" + "\n".join(body) + "\n}")
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    for name, shape in (("W", (D, 4 * H)), ("U", (H, 4 * H)), ("B", (4 * H,))):
        model.graph.initializer.append(onnx.numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name))
    onnx.checker.check_model(model)
    return model


def test_rewrite_batches_parallel_lstm_cells(tmp_path: Path):
    """Without --check, which keeps the input where the batched graph measures slower."""
    source, target = tmp_path / "cells.onnx", tmp_path / "batched.onnx"
    onnx.save(lstm_copies_model(), source)
    result = autobatch_cli("rewrite", str(source), "-o", str(target))
    assert result.returncode == 0, result.stderr
    print(result.stdout)  # the before/after table, in the test log
    before, after = onnx.load(source), onnx.load(target)
    feeds = random_feeds(from_onnx(before), np.random.default_rng(0))
    for want, got in zip(ort_run(before, feeds), ort_run(after, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    onnx.checker.check_model(after)
    assert len(after.graph.node) < len(before.graph.node)
    for kind in ("input", "output"):
        assert [(v.name, v.type) for v in getattr(before.graph, kind)] == [(v.name, v.type) for v in getattr(after.graph, kind)]
    counts = op_counts(from_onnx(after))
    # K copies -> one batched op each; the three gates of all copies -> one Sigmoid
    assert counts["MatMul"] == 2 and counts["Sigmoid"] == 1


def test_rewrite_batches_branches_of_a_symbolic_length(tmp_path: Path):
    """Every branch's length ``L`` unknown until run time: the rewritten graph reads L from its inputs."""
    from benchmarks.rewrite_branches import lstm_tagger_branches, one_symbolic_length

    source, target = tmp_path / "branches.onnx", tmp_path / "batched.onnx"
    onnx.save(one_symbolic_length(lstm_tagger_branches([4] * 4, 6, 5)), source)
    result = autobatch_cli("rewrite", str(source), "-o", str(target))
    assert result.returncode == 0, result.stderr
    before, after = onnx.load(source), onnx.load(target)
    assert op_counts(from_onnx(after))["LSTM"] == 2  # a packed launch a layer for all four branches
    assert [(v.name, v.type) for v in before.graph.input] == [(v.name, v.type) for v in after.graph.input]
    for length in (1, 3, 20):
        feeds = random_feeds(from_onnx(before), np.random.default_rng(length), {"L": length})
        for want, got in zip(ort_run(before, feeds), ort_run(after, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rewrite_of_cells_over_a_symbolic_number_of_rows_runs_rows_of_one_as_written(tmp_path: Path):
    """Batched for N = 1, the cells read their rows another way than for N >= 2: the rewritten
    model runs the batched graph where N >= 2 and the model as written below (an If)."""
    source, target = tmp_path / "cells.onnx", tmp_path / "batched.onnx"
    onnx.save(lstm_copies_model(rows="N"), source)
    result = autobatch_cli("rewrite", str(source), "-o", str(target))
    assert result.returncode == 0, result.stderr
    assert "for sizes under 2 it runs the model as written" in result.stdout
    before, after = onnx.load(source), onnx.load(target)
    (choice,) = [node for node in after.graph.node if node.op_type == "If"]
    batched = next(a.g for a in choice.attribute if a.name == "else_branch")
    assert sum(node.op_type == "MatMul" for node in batched.node) == 2  # K copies -> one product each
    for rows in (0, 1, 2, 7):
        feeds = random_feeds(from_onnx(before), np.random.default_rng(rows), {"N": rows})
        for want, got in zip(ort_run(before, feeds), ort_run(after, feeds)):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rewrite_check_runs_symbolic_dimensions_at_the_sizes_given(tmp_path: Path):
    source, target = tmp_path / "cells.onnx", tmp_path / "batched.onnx"
    onnx.save(lstm_copies_model(rows="N"), source)
    result = autobatch_cli("rewrite", str(source), "-o", str(target), "--check", "--dim", "N=20")
    assert result.returncode == 0, result.stderr
    assert "check at N=20: outputs equal" in result.stdout
    wrong = autobatch_cli("rewrite", str(source), "-o", str(target), "--check", "--dim", "L=20")
    assert wrong.returncode == 1 and "--dim names 'L', which no input's shape has (its symbolic dimensions: N)" in wrong.stderr
    unchecked = autobatch_cli("rewrite", str(source), "-o", str(target), "--dim", "N=20")
    assert unchecked.returncode == 2 and "--dim sizes the inputs --check runs; add --check" in unchecked.stderr


def test_rewrite_says_why_it_writes_a_model_unchanged(tmp_path: Path):
    source, target = tmp_path / "cells.onnx", tmp_path / "same.onnx"
    onnx.save(lstm_copies_model(rows="?"), source)  # each input's rows a symbol of its own
    result = autobatch_cli("rewrite", str(source), "-o", str(target), "--check")
    assert result.returncode == 0, result.stderr
    assert "not batched: its inputs have 18 symbolic dimensions (at most 8 are tried); written unchanged" in result.stdout
    assert "check at ?=16: outputs equal" in result.stdout  # unnamed dimensions are sized for the check too


def test_rewrite_keeps_results_of_a_graph_with_nothing_to_batch(tmp_path: Path):
    model = onnx.parser.parse_model("""
    <ir_version: 9, opset_import: ["" : 18]>
    g (float[2, 3] x) => (float[2, 3] y) { a = Relu(x)  y = Tanh(a) }
    """)
    rewritten = batch_one_graph(from_onnx(model))
    x = np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32)
    from autobatch.ir import to_onnx

    np.testing.assert_allclose(ort_run(to_onnx(rewritten), {"x": x})[0], np.tanh(np.maximum(x, 0)), rtol=1e-6)


def test_inspect_prints_ops_io_groups_and_plan(tmp_path: Path):
    source = tmp_path / "cells.onnx"
    onnx.save(lstm_copies_model(2), source)
    result = autobatch_cli("inspect", str(source), "--instances", "3", "--draw", str(tmp_path / "g.svg"))
    assert result.returncode == 0, result.stderr
    assert "input  x0: FLOAT[1,8]" in result.stdout and "output hn1: FLOAT[1,16]" in result.stdout
    assert "MatMul x4" in result.stdout and "signature classes" in result.stdout
    assert "ways to batch them: Add stacked, ragged, padded; MatMul stacked, ragged, padded;" in result.stdout
    assert "plan for 3 instances" in result.stdout and "lower bound" in result.stdout
    launches = next(line for line in result.stdout.splitlines() if "launches by op:" in line)
    assert "MatMul 2," in launches and "Sigmoid 1" in launches  # the plan run_batch runs: each class once
    assert "verdict: run_batch" in result.stdout and "onnxruntime one instance at a time" in result.stdout
    assert (tmp_path / "g.svg").read_bytes().lstrip().startswith((b"<?xml", b"<svg"))


def test_inspect_says_why_a_node_runs_a_class_per_shape(tmp_path: Path):
    """Instances of random, different lengths: a Concat along the length axis is neither ragged
    nor padded, and inspect says why, beside its launches."""
    source = tmp_path / "concat.onnx"
    onnx.save(onnx.parser.parse_model("""<ir_version: 8, opset_import: ["" : 17]>
        g (float[1, L, 2] x) => (float[1, M, 2] y) {
        s = Sigmoid(x)
        y = Concat<axis = -2>(s, x) }"""), source)
    result = autobatch_cli("inspect", str(source), "--instances", "6")
    assert result.returncode == 0, result.stderr
    launches = next(line for line in result.stdout.splitlines() if "launches by op:" in line)
    assert "Sigmoid 1" in launches and "Concat 1," not in launches  # ragged Sigmoid; a Concat per length
    assert ("a class per shape, 1 node: Concat: not ragged (an output whose rows are not its operands' in number); "
            "not padded (operands joined along an axis that members pad)") in result.stdout


@pytest.mark.parametrize("command", ["inspect", "rewrite", "run"])
def test_missing_and_non_onnx_files(tmp_path: Path, command: str):
    extra = {"inspect": [], "rewrite": ["-o", str(tmp_path / "o.onnx")],
             "run": ["--inputs", str(tmp_path / "i.jsonl"), "-o", str(tmp_path / "o.jsonl")]}[command]
    (tmp_path / "i.jsonl").write_text("{}\n")
    missing = autobatch_cli(command, str(tmp_path / "absent.onnx"), *extra)  # refused with the command's usage
    assert missing.returncode == 2 and missing.stderr.startswith(f"usage: autobatch {command}")
    assert missing.stderr.splitlines()[-1].endswith("absent.onnx: no such file")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not a model at all")
    garbage = autobatch_cli(command, str(junk), *extra)
    assert garbage.returncode == 1 and "not an ONNX model" in garbage.stderr


RUN_MODEL = """
<ir_version: 9, opset_import: ["" : 18]>
g (float[N, 3] x) => (float[N] s) <float[3, 3] W = {1, 0, 0, 0, 2, 0, 0, 0, 3}> {
    h = MatMul(x, W)
    t = Tanh(h)
    one = Constant <value_ints = [1]> ()
    s = ReduceSum <keepdims = 0> (t, one)
}
"""


@pytest.mark.parametrize("suffix", [".jsonl", ".npz"])
def test_run_over_a_file_with_one_bad_instance(tmp_path: Path, suffix: str):
    model_path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(RUN_MODEL), model_path)
    rng = np.random.default_rng(2)
    good = [rng.standard_normal((n, 3)).astype(np.float32) for n in (2, 5, 1, 3)]
    bad = rng.standard_normal((2, 4)).astype(np.float32)  # wrong width
    instances = [good[0], good[1], bad, good[2], good[3]]
    inputs, output = tmp_path / f"in{suffix}", tmp_path / f"out{suffix}"
    if suffix == ".npz":
        np.savez(inputs, **{f"{k}/x": x for k, x in enumerate(instances)})
    else:
        lines = [json.dumps({"x": x.tolist()}) for x in instances] + ['{"y": [[1, 2, 3]]}', "not json"]
        inputs.write_text("\n".join(lines) + "\n")
    result = autobatch_cli("run", str(model_path), "--inputs", str(inputs), "-o", str(output), "--batch-size", "3",
                           "--no-progress")
    assert result.returncode == 2, result.stderr  # some instances failed
    expected = [np.tanh(x @ np.diag([1, 2, 3]).astype(np.float32)).sum(axis=1) for x in good]
    if suffix == ".npz":
        with np.load(output) as data:
            values = {k: data[f"{k}/s"] for k in (0, 1, 3, 4)}
            assert "shape (2, 4)" in str(data["2/error"])
    else:
        records = [json.loads(line) for line in output.read_text().splitlines()]
        values = {r["index"]: np.array(r["outputs"]["s"]) for r in records if "outputs" in r}
        errors = {r["index"]: r["error"] for r in records if "error" in r}
        assert "shape (2, 4)" in errors[2] and "unknown input" in errors[5] and "line 7" in errors[6]
    for k, want in zip((0, 1, 3, 4), expected):
        np.testing.assert_allclose(values[k], want, rtol=1e-5, atol=1e-6)
    assert "4 instances ran, " in result.stdout


def test_run_rejects_an_unknown_output_format(tmp_path: Path):
    model_path = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(RUN_MODEL), model_path)
    (tmp_path / "i.jsonl").write_text('{"x": [[1, 2, 3]]}\n')
    result = autobatch_cli("run", str(model_path), "--inputs", str(tmp_path / "i.jsonl"), "-o", str(tmp_path / "o.csv"))
    assert result.returncode == 2 and "o.csv: the output must be a .npz or .jsonl file" in result.stderr


def test_rewrite_a_pytorch_export_with_a_python_loop_over_branches(tmp_path: Path):
    torch = pytest.importorskip("torch")  # .ci/run installs the CPU build of torch 2.13

    class Branches(torch.nn.Module):
        def __init__(self, branches: int = 4) -> None:
            super().__init__()
            self.branches = branches
            self.cell = torch.nn.Linear(8, 16)
            self.out = torch.nn.Linear(16, 3)

        def forward(self, x):  # one branch a row, looped over in Python: the exporter unrolls it
            return torch.stack([torch.log_softmax(self.out(torch.tanh(self.cell(x[i]))), dim=-1)
                                for i in range(self.branches)])

    torch.manual_seed(0)
    source, target = tmp_path / "branches.onnx", tmp_path / "batched.onnx"
    with pytest.warns(DeprecationWarning):  # the TorchScript exporter; the new one needs onnxscript
        torch.onnx.export(Branches().eval(), (torch.randn(4, 1, 8),), str(source), dynamo=False, opset_version=17)
    result = autobatch_cli("rewrite", str(source), "-o", str(target))
    assert result.returncode == 0, result.stderr
    print(result.stdout)
    feeds = random_feeds(from_onnx(source), np.random.default_rng(0))
    for want, got in zip(ort_run(onnx.load(source), feeds), ort_run(onnx.load(target), feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    before, after = op_counts(from_onnx(source)), op_counts(from_onnx(target))
    assert before["Gemm"] == 8 and after["Gemm"] == 2 and after["Tanh"] == 1 and after["LogSoftmax"] == 1
    assert sum(after.values()) < sum(before.values())


def test_rewrite_leaves_a_model_it_cannot_shrink_unchanged(tmp_path: Path):
    source = Path(onnx.__file__).parent / "backend/test/data/light/light_squeezenet.onnx"
    target = tmp_path / "same.onnx"
    result = autobatch_cli("rewrite", str(source), "-o", str(target), "--check")
    assert result.returncode == 0, result.stderr
    assert "written unchanged" in result.stdout and "check: outputs equal" in result.stdout
    assert op_counts(from_onnx(target)) == op_counts(from_onnx(source))


NEG = '<ir_version: 8, opset_import: ["" : 17]> g (int32[N, 2] x) => (int32[N, 2] y) { y = Neg(x) }'


def test_run_refuses_what_it_would_change_and_goes_on_past_unreadable_lines(tmp_path: Path):
    """1.9 fed to an int input became 1; an oversized int, a broken or binary line aborted the
    whole run with a traceback. Each is now that line's own error."""
    onnx.save(onnx.parser.parse_model(NEG), tmp_path / "neg.onnx")
    lines = [b'{"x": [[1.9, 2]]}', b'{"x": [[1, 2]]}', b'{"x": [[100000000000000000000000000000, 2]]}',
             b'{"x": [[3000000000, 2]]}', b'{"x": [[1, 2], [3]]}', b"not json", b"\xff\xfe\x00garbage",
             b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"x": [[-4, 5]]}']
    (tmp_path / "in.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    result = autobatch_cli("run", str(tmp_path / "neg.onnx"), "--inputs", str(tmp_path / "in.jsonl"), "-o",
                           str(tmp_path / "out.jsonl"), "--no-progress")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r.get("outputs", {}).get("y") for r in records] == [None, [[-1, -2]], None, None, None, None, None, None,
                                                                 [[4, -5]]]
    errors = [r.get("error", "") for r in records]
    assert "1.9 does not fit int32" in errors[0] and "3000000000 does not fit int32" in errors[3]
    assert "integers past 64 bits" in errors[2] and "rectangular" in errors[4]
    assert "not JSON" in errors[5] and "not JSON" in errors[6] and "nested too deeply" in errors[7]


def test_run_refuses_an_npz_array_whose_header_lies_about_its_size(tmp_path: Path):
    """A header declaring 10^12 elements in a few bytes: MemoryError and a traceback before."""
    import io
    import zipfile

    onnx.save(onnx.parser.parse_model(NEG), tmp_path / "neg.onnx")
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<i4", "fortran_order": False, "shape": (10**12,)})
    good = io.BytesIO()
    np.save(good, np.array([[3, -1]], np.int32))
    with zipfile.ZipFile(tmp_path / "in.npz", "w") as archive:
        archive.writestr("0/x.npy", header.getvalue() + b"\0" * 16)
        archive.writestr("1/x.npy", good.getvalue())
    result = autobatch_cli("run", str(tmp_path / "neg.onnx"), "--inputs", str(tmp_path / "in.npz"), "-o",
                           str(tmp_path / "out.jsonl"), "--no-progress")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert "declares shape [1000000000000]" in records[0]["error"] and records[1]["outputs"]["y"] == [[-3, 1]]


def test_rewrite_check_of_a_model_saved_at_ir_14(tmp_path: Path):
    """onnx 1.23 saves IR 14, which onnxruntime 1.31 refuses: --check printed its traceback."""
    model = onnx.parser.parse_model('<ir_version: 14, opset_import: ["" : 21]> g (float[N, 2] x) => (float[N, 2] y) '
                                    "{ a = Relu(x)  b = Relu(x)  y = Add(a, b) }")
    onnx.save(model, tmp_path / "ir14.onnx")
    result = autobatch_cli("rewrite", str(tmp_path / "ir14.onnx"), "-o", str(tmp_path / "out.onnx"), "--check")
    assert result.returncode == 0 and "check at N=16: outputs equal" in result.stdout, result.stderr


@pytest.mark.parametrize("command", ["inspect", "rewrite", "run"])
def test_an_opset_onnx_does_not_define_is_one_line(tmp_path: Path, command: str):
    model = onnx.parser.parse_model(NEG)
    model.opset_import[0].version = 999
    onnx.save(model, tmp_path / "m.onnx")
    (tmp_path / "in.jsonl").write_text('{"x": [[1, 2]]}\n')
    extra = {"inspect": [], "rewrite": ["-o", str(tmp_path / "o.onnx")],
             "run": ["--inputs", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl")]}[command]
    result = autobatch_cli(command, str(tmp_path / "m.onnx"), *extra)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "opset 999 of domain 'ai.onnx' is not one this onnx" in result.stderr


def test_every_option_says_what_it_does_and_its_default_and_each_command_shows_examples():
    import argparse

    from autobatch.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in commands.items():
        assert sub.epilog and sub.epilog.startswith("examples:"), name
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                assert action.help, f"autobatch {name} {action.option_strings or action.dest} has no help"
    text = autobatch_cli("run", "--help").stdout
    assert "(default: 64)" in text and "examples:" in text and "autobatch run model.onnx" in text


@pytest.mark.parametrize("args, words", [
    (["run", "m.onnx", "--inputs", "i.jsonl", "-o", "o.jsonl", "--batch-size", "0"], "usage: autobatch run"),
    (["inspect", "m.onnx", "--instances", "-3"], "-3 is out of range: it must be at least 0"),
    (["inspect", "."], ". is a directory, not a file"),
    (["inspect", "m.onnx", "--draw", "out.pdf"], "out.pdf: the output must be a .png or .svg or .dot file"),
    (["demo", "-o", "/nonexistent/x.onnx"], "the folder /nonexistent does not exist"),
    (["serve", "prog.py"], "a program is served as prog.py:FUNCTION"),
    (["serve", "m.onnx", "--port", "70000"], "70000 is out of range"),
])
def test_arguments_are_checked_before_any_work(tmp_path: Path, args: list[str], words: str):
    onnx.save(onnx.parser.parse_model(NEG), tmp_path / "m.onnx")
    (tmp_path / "i.jsonl").write_text('{"x": [[1, 2]]}\n')
    result = subprocess.run([sys.executable, "-m", "autobatch", *args], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "x.onnx").exists()


def test_a_missing_extra_is_named_in_one_line(tmp_path: Path):
    onnx.save(onnx.parser.parse_model(NEG), tmp_path / "m.onnx")
    code = ("import sys; sys.modules['uvicorn'] = None; from autobatch.cli import main; "
            f"sys.exit(main(['serve', {str(tmp_path / 'm.onnx')!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "pip install 'onnx-autobatch[serve]'" in result.stderr


@pytest.mark.parametrize("module", ["autobatch.examples.loop_rnn", "autobatch.examples.tree_lstm",
                                    "autobatch.examples.ray_serve", "benchmarks", "benchmarks.serving_load",
                                    "benchmarks.batcher_launches"])
def test_examples_and_benchmarks_answer_help(module: str):
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0 and result.stdout.startswith(f"usage: python -m {module}"), result.stdout[:300]


def test_inspect_shows_and_draws_the_node_level_plan_run_batch_runs(tmp_path: Path):
    """Attention over instances of different lengths: run_batch plans it once per node, so
    inspect prints that plan and draws the one graph that runs it (its padded chunks' feeds)."""
    from tests.test_padding import ATTENTION

    source = tmp_path / "attention.onnx"
    onnx.save(ATTENTION, source)
    result = autobatch_cli("inspect", str(source), "--instances", "6", "--draw", str(tmp_path / "g.dot"))
    assert result.returncode == 0, result.stderr
    assert "launches (instance axis)" in result.stdout
    drawn = (tmp_path / "g.dot").read_text()
    assert 'label="Where"' in drawn and 'label="rowsx4"' in drawn  # the Softmax's key mask; the rows axis
