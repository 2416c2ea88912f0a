"""``python -m benchmarks --quick``: every task, every system we have here, checked on a few small
instances (PyTorch and DyNet parts are skipped, with a message, when they are not installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.paper import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # 30-100 s: run by .ci/run after the default suite
def test_benchmarks_quick(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--json", str(out)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "CHECK FAILED" not in done.stdout
    import json

    records = json.loads(out.read_text())["records"]
    tasks = {r["task"] for r in records}
    assert tasks == {"treelstm", "bilstm", "chartagger", "parser"}
    for task in tasks:
        ours = [r for r in records if r["task"] == task and r["system"] == "ours"]
        assert len(ours) == 3 * 2 * 4  # 3 forms (with sequences, or a fold) x 2 backends x (alone + 3 schedulers)
        assert all(r["check"] == "ok" and r["instances_per_s"] > 0 for r in records if r["task"] == task)


def test_lockstep_rounds_benchmark_compares_both_ways_and_checks_they_agree(capsys) -> None:
    from benchmarks import lockstep_rounds

    lockstep_rounds.main(["--programs", "6", "--size", "8", "--repeats", "1"])
    lines = capsys.readouterr().out.splitlines()
    for task in ("parser (sequences)", "greedy decoder"):
        planned, made = (line.split() for line in lines if line.startswith(task))
        assert planned[-3] == "0" and int(made[-3]) > 0, (planned, made)  # rounds made from a plan: none, some
    assert sum("results agree: yes" in line for line in lines) == 2, lines


def test_unknown_task_is_refused_before_anything_runs() -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--quick", "--tasks", "treelstm,tagger"])
    assert refused.value.code == 2


def test_sequence_chunks_benchmark_compares_every_variant(capsys) -> None:
    from benchmarks import sequence_chunks

    sequence_chunks.main(["--sentences", "9", "--size", "8", "--repeats", "1"])
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    for variant in ("by cost (the library's), baked", "chunks of 4, baked", "chunks of 8, baked", "chunks of 32, baked",
                    "one padded call, baked", "chunks of 8, fed"):
        assert sum(line.startswith(variant) for line in lines) == 4  # words and characters, each way
    assert sum(line.startswith("by cost (the library's), baked") and "1.00x the library's" in line for line in lines) == 4
    assert [line.split(":")[0] for line in lines if line.startswith(("words", "characters"))] == ["words", "characters"]


@pytest.mark.parametrize("module, flag, checked, systems", [
    ("onnx_tagger", "--sentences", "sentence", ("onnxruntime, one sentence at a time", "ours (onnxruntime), run_batch",
                                                "ours (numpy), run_batch", "ours (onnxruntime, step by step), run_batch")),
    ("onnx_encoder", "--texts", "text", ("onnxruntime, one text at a time", "run_batch (one onnxruntime session)",
                                         "run_batch (step by step)")),
])
def test_onnx_model_benchmarks_check_and_compare(capsys, module, flag, checked, systems) -> None:
    import importlib

    importlib.import_module(f"benchmarks.{module}").main([flag, "5", "--size", "8", "--repeats", "1"])
    printed = capsys.readouterr().out
    assert f"every batched result equals onnxruntime's for its {checked} alone" in printed
    for system in systems:
        assert system in printed


def test_rewrite_branches_benchmark_checks_and_compares(capsys) -> None:
    from benchmarks import rewrite_branches

    rewrite_branches.main(["--branches", "3", "--size", "8", "--repeats", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("LSTM tagger", "encoder"))]
    assert len(rows) == 4
    for row in rows[2:]:  # one symbolic length: rewritten all the same (a graph left as it is keeps its ops)
        ops_in, ops_out = row.split()[-6:-4]
        assert int(ops_out) != int(ops_in) and float(row.split()[-1]) == 0, row


def test_exported_models_benchmark_checks_and_compares(capsys, tmp_path) -> None:
    pytest.importorskip("torch")
    from benchmarks import exported_models

    exported_models.main(["--models", "lstm", "--size", "8", "--texts", "3", "--repeats", "1",
                          "--json", str(tmp_path / "times.json")])
    printed = capsys.readouterr().out
    for system in ("one text at a time", "padded to the longest", "the same mix again", "a new mix each call",
                   "as a session chooses", "the session chose for its timed new mixes: ",
                   "the new mixes against onnxruntime one text at a time over the same mixes: batched ",
                   "PyTorch eager, padded to the longest, one call",  # (its module checked against the export first)
                   "the new mixes batched against the padded batch: onnxruntime "):
        assert system in printed
    assert set(json.loads((tmp_path / "times.json").read_text())["lstm"]) >= {
        "onnxruntime, one text at a time", "onnxruntime, one text at a time, the new mixes",
        "ours, run_batch, a new mix each call (lengths seen)",
        "ours, run_batch as a session chooses, a new mix each call (lengths seen)",
        "PyTorch eager, padded to the longest, one call"}


def test_exported_models_benchmark_reads_a_folder_of_exports_written_before(capsys, tmp_path) -> None:
    """As ``gpu_check.sh`` runs it where PyTorch is missing: the exports are written first
    (``benchmarks.export_files``), then read, not written again, on the providers asked for."""
    pytest.importorskip("torch")
    from benchmarks import export_files, exported_models

    export_files.main([str(tmp_path), "--models", "lstm", "--size", "8"])
    written = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    assert set(written) == {"lstm-8.onnx", "lstm-8-padded.onnx"}
    exported_models.main(["--models", "lstm", "--size", "8", "--texts", "3", "--repeats", "1",
                          "--exports", str(tmp_path), "--providers", "cpu"])
    assert "onnxruntime on CPUExecutionProvider" in capsys.readouterr().out
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == written
    with pytest.raises(SystemExit):
        export_files.main([str(tmp_path), "--models", "lstm,resnet"])
    assert "unknown model 'resnet'" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["lstm", "bert-mask"])
def test_serving_load_serves_an_exported_model_with_nothing_lost_or_wrong(capsys, model) -> None:
    """A real ``autobatch serve`` on loopback, batching on and off, for the LSTM tagger as
    PyTorch exports it and BERT exported with its attention mask (a request of two inputs, as a
    tokenizer gives them): every answer checked against the instance run alone."""
    pytest.importorskip("torch")
    if model.startswith("bert"):
        pytest.importorskip("transformers")
    from benchmarks import serving_load

    assert serving_load.main(["--model", model, "--size", "8", "--requests", "12", "--clients", "4",
                              "--backend", "onnxruntime", "--warm-every-length"]) == 0
    printed = capsys.readouterr().out
    assert "12 requests to " + model in printed
    assert "batching on" in printed and "always batched" in printed and "batching off" in printed


def test_tracing_cost_measures_each_way_beside_the_bare_recorder(capsys) -> None:
    from benchmarks import tracing_cost

    us = tracing_cost.main(["--steps", "60", "--size", "4", "--instances", "6", "--repeats", "1"])
    tasks = {f"planning {task} {form}, a record" for task in ("treelstm", "bilstm") for form in ("primitive", "cells")}
    assert set(us) == {"primitive op, traced", "cell call, traced", "bare recorder, an op",
                       "planning, a primitive record"} | tasks
    assert all(value > 0 for value in us.values())
    printed = capsys.readouterr().out
    assert "x the bare recorder" in printed and "records planned" in printed and "lower bound" in printed


def test_issue_19_table_takes_each_forms_best_row_and_says_how_far_a_target_is() -> None:
    from benchmarks.paper import Record, issue_19_table

    def row(system: str, variant: str, rate: float) -> Record:
        return Record("treelstm", system, variant, "onnxruntime", 64, rate)

    records = [row("ours", "primitive, batched depth", 100.0), row("ours", "primitive, batched level", 150.0),
               row("ours", "primitive, one at a time", 900.0),  # not batched: not a candidate
               row("ours", "cells, batched level", 800.0), row("ours", "fold, batched agenda", 1200.0),
               row("dynet", "autobatch=1", 400.0), row("dynet", "autobatch=0", 4000.0),  # not autobatch: left out
               row("pytorch", "hand-batched", 1500.0)]
    header, _, line = issue_19_table(records)
    assert "primitive / DyNet (>= 0.5)" in header
    assert line == ("| treelstm | 150.0 | 800.0 | 1,200.0 (fold) | 400.0 | 1,500.0 | 0.38 missed (1.3x short) | "
                    "2.00 MET | 0.80 missed (1.2x short) |")


def test_a_lockstep_tasks_time_is_split_per_round_around_its_kernels() -> None:
    """Issue 19 asks a lockstep round to cost little more than its kernels: the parser's line
    says what a round costs beside them, from the minibatch's totals."""
    from benchmarks.paper import Record, time_split

    parser = Record("parser", "ours", "cells, batched level", "onnxruntime", 64, 640.0, seconds=0.1, trace_s=0.02,
                    batching_s=0.01, exec_s=0.07, exec_detail={"gather": 0.005, "kernels": 0.04, "scatter": 0.001},
                    rounds=100)
    assert time_split(parser).endswith("; 100 lockstep rounds, 1000 us a round = kernels 400 us + 600 us around them "
                                       "(tracing and the host's choices 200, batching 100, the rest of running 300)")
    tree = Record("treelstm", "ours", "fold, batched level", "onnxruntime", 64, 640.0, seconds=0.1, trace_s=0.02,
                  batching_s=0.01, exec_s=0.07, exec_detail={"kernels": 0.04})
    assert "lockstep" not in time_split(tree)
