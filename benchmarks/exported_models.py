"""Models as PyTorch and Hugging Face export them for ONE text (``benchmarks.exports``), run for
many texts of different lengths, side by side: onnxruntime one text at a time; onnxruntime once
over all of them padded to the longest (a second export, for a padded batch with a mask); the
same PyTorch module eager over that padded batch (where PyTorch, and ``transformers`` for its
models, are installed: the module is built again from its seed, and checked to give
onnxruntime's result for a text alone first); and
``InferenceSession.run_batch``: the first call (planning and preparing), a repeated mix (its
kept plan, one onnxruntime session) and a new mix of lengths every call (what a server sees;
timed once every length 5..60 has been seen once, a server's steady state), batched, and as a
session with its defaults chooses (each new mix batched or each instance alone, whichever it
measured faster: ``autobatch.ways``).

    python -m benchmarks.exported_models [--models lstm,encoder,bert,bert-mask,bert-cls-mask,gpt2,cnn] [--size 256] [--texts 64]
        [--providers auto|cpu|cuda]

Lengths are drawn lognormal (median 17, clipped to 5..60), a new draw for each new mix; the
CNN's images are 16..64 pixels a side. The systems take turns (one timed call each a round,
``--repeats`` rounds, the fastest kept), so that this machine's drifts reach them all; each
is timed on its second call in a row (the first on another new mix), as in a stream of batches. Every
batched result is checked against onnxruntime's for its text alone first (float32 within 1e-4
relative: a projection of every text's rows sums in another order). Padding is exact only where
a mask reaches every padded position: not for the taggers' reverse direction (its time says
what padding costs, not a result one could use).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from autobatch import InferenceSession, arguments
from autobatch.ways import BATCHED_FIRST
from benchmarks import export_files as exports
from benchmarks.timing import print_against

THREADS = 2
NEW_MIXES_ALONE = "onnxruntime, one text at a time, the new mixes"
PADDED_ORT, PADDED_EAGER = "onnxruntime, padded to the longest, one call", "PyTorch eager, padded to the longest, one call"


def lengths(count: int, rng: np.random.Generator) -> list[int]:
    return np.clip(np.rint(rng.lognormal(np.log(17), 0.6, count)), 5, 60).astype(int).tolist()


def texts(sizes: list[int], rng: np.random.Generator, mask: bool = False) -> list[dict[str, np.ndarray]]:
    """Texts of these lengths (with their attention ``mask`` too: every token real)."""
    return [{"ids": rng.integers(0, exports.VOCABULARY, (1, n)), **({"mask": np.ones((1, n), np.int64)} if mask else {})}
            for n in sizes]


def images(count: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    sides = rng.integers(16, 65, (count, 2))
    return [{"ids": rng.standard_normal((1, 3, int(h), int(w))).astype(np.float32)} for h, w in sides]


def instances(name: str, count: int, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    return images(count, rng) if name == "cnn" else texts(lengths(count, rng), rng, name.endswith(exports.MASKED))


def padded(batch: list[dict[str, np.ndarray]], inputs: set[str]) -> dict[str, np.ndarray]:
    if batch[0]["ids"].ndim == 4:  # images: zeros to the right and below
        height, width = (max(image["ids"].shape[axis] for image in batch) for axis in (2, 3))
        stacked = np.zeros((len(batch), 3, height, width), np.float32)
        for k, image in enumerate(batch):
            stacked[k, :, :image["ids"].shape[2], :image["ids"].shape[3]] = image["ids"][0]
        return {"ids": stacked}
    longest = max(text["ids"].shape[1] for text in batch)
    ids = np.zeros((len(batch), longest), np.int64)
    mask = np.zeros((len(batch), longest), np.int64)
    for k, text in enumerate(batch):
        ids[k, :text["ids"].shape[1]] = text["ids"][0]
        mask[k, :text["ids"].shape[1]] = 1
    return {name: value for name, value in (("ids", ids), ("mask", mask)) if name in inputs}


def session_of(path: Path, providers: list[str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = THREADS, 1
    return ort.InferenceSession(str(path), options, providers=providers)


def compare(name: str, size: int, count: int, repeats: int, folder: Path, providers: list[str]) -> dict[str, float]:
    one, many = exports.exported(name, size, folder)
    rng = np.random.default_rng(0)
    batch = instances(name, count, rng)
    alone, pad = session_of(one, providers), session_of(many, providers)
    pad_inputs = {info.name for info in pad.get_inputs()}
    # Always batched, to time the batched plan itself (a session's default may run a new mix
    # each alone, where it measured that faster: ``autobatch.ways``; timed below on its own).
    ours = InferenceSession(str(one), None, providers, threads=THREADS, alone_when_faster=False)
    start = time.perf_counter()
    first = ours.run_batch(None, batch)
    seconds = {"ours, first call (plans, prepares)": time.perf_counter() - start}
    for want, got in zip((alone.run(None, text)[0] for text in batch), first, strict=True):
        np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5, err_msg=name)
    # ``chosen`` is a session with its defaults: it runs each new mix batched or each text alone,
    # whichever it measured faster (``autobatch.ways``), once it has measured both.
    chosen = InferenceSession(str(one), None, providers, threads=THREADS)
    # A server's steady state: every length seen once (its shapes typed, its templates made), then
    # each call a mix of lengths never batched together before.
    if name != "cnn":  # (images: most of their 49^2 sizes are new in each mix)
        for session in (ours, chosen):
            session.run_batch(None, texts(list(range(5, 61)), rng, name.endswith(exports.MASKED)))
    # What a new mix costs batched and alone, then, run alone, at once and in turn, as the session measures it.
    for _ in range(2 * (BATCHED_FIRST + 2)):
        chosen.run_batch(None, instances(name, count, rng))
    mixes = [instances(name, count, rng) for _ in range(repeats)]
    warm_mixes = [instances(name, count, rng) for _ in range(repeats)]  # each new-mix call's untimed one before
    seen = "sizes new" if name == "cnn" else "lengths seen"
    new_mix = {"batched": f"ours, run_batch, a new mix each call ({seen})",
               "as a session chooses": f"ours, run_batch as a session chooses, a new mix each call ({seen})"}
    # Each system's call, given the new mix of this round (a system of the same mix ignores it).
    systems = {
        "onnxruntime, one text at a time": lambda mix: [alone.run(None, t) for t in batch],
        # The new mixes are other draws, with more or fewer tokens than ``batch``: their rows
        # are compared with onnxruntime over the same mixes too.
        NEW_MIXES_ALONE: lambda mix: [alone.run(None, t) for t in mix],
        PADDED_ORT: lambda mix: pad.run(None, padded(batch, pad_inputs)),
        "ours, run_batch, the same mix again": lambda mix: ours.run_batch(None, batch),
        new_mix["batched"]: lambda mix: ours.run_batch(None, mix),
        new_mix["as a session chooses"]: lambda mix: chosen.run_batch(None, mix),
    }
    eager = eager_padded(name, size, batch, pad_inputs, alone)
    if eager is not None:
        systems[PADDED_EAGER] = eager
    for run in list(systems.values())[:4]:  # warm-ups (the same mix's second use makes its one session)
        run(mixes[0]), run(mixes[0])
    # The systems take turns, each timed once a round, so that the machine's drifts reach them all.
    times: dict[str, list[float]] = {label: [] for label in systems}
    ways, split = [], (float("inf"), {}, 0.0)
    for k in range(repeats):
        for label, run in systems.items():
            # The last system's onnxruntime threads may still spin (its default): each system
            # starts on idle cores, and is timed on its second call, as in a stream of batches
            # (here a core idle for 0.1 s runs the next milliseconds of two-thread work slower:
            # benchmarks/README.md "Warm calls").
            time.sleep(0.1)
            run(warm_mixes[k])
            start = time.perf_counter()
            run(mixes[k])
            times[label].append(time.perf_counter() - start)
            if label == new_mix["batched"] and times[label][-1] < split[0]:
                split = (times[label][-1], dict(ours.stats.seconds, **ours.stats.execution), times[NEW_MIXES_ALONE][k])
        stats = chosen.stats
        ways.append(("alone at once" if stats.at_once > 1 else "alone in turn") if stats.alone else "batched")
    ours.run_batch(None, batch)  # its stats, for the launches printed below
    seconds.update((label, min(values)) for label, values in times.items())
    extent = [t["ids"].shape[-1] for t in batch]
    print(f"{name}: size {size}, {count} instances, lengths (or widths) {min(extent)}..{max(extent)}; "
          f"{ours.stats.report.launches} launches "
          f"({ours.stats.report.launches_by_op.get('Softmax', 0)} Softmax)")
    print_against(seconds, "onnxruntime, one text at a time", lambda value: f"{value * 1e3:9.2f} ms")
    print("  the new mixes against onnxruntime one text at a time over the same mixes: "
          + ", ".join(f"{way} {seconds[NEW_MIXES_ALONE] / seconds[label]:.2f}x" for way, label in new_mix.items()))
    print("  the new mixes batched against the padded batch: " + ", ".join(
        f"{label.split(',')[0]} {seconds[label] / seconds[new_mix['batched']]:.2f}x" for label in (PADDED_ORT, PADDED_EAGER)
        if label in seconds))
    print(f"  the session chose for its timed new mixes: {', '.join(ways)}")
    print_new_mix_split(*split)
    return seconds


def eager_padded(name: str, size: int, batch: list[dict[str, np.ndarray]], pad_inputs: set[str],
                 alone: ort.InferenceSession) -> Callable[[Any], Any] | None:
    """A call of the PyTorch module the export was made of, eager over ``batch`` padded to the
    longest; None (said) where PyTorch or ``transformers`` is not installed."""
    try:
        import torch

        from benchmarks import exports as modules  # (PyTorch, and transformers for its models)

        module = modules.build(name.removesuffix(exports.MASKED), size)
    except ImportError as error:
        print(f"  (no PyTorch eager row: {error})")
        return None
    torch.set_num_threads(THREADS)

    def run(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return module(*(torch.from_numpy(feeds[key]) for key in ("ids", "mask") if key in feeds)).numpy()

    # The module built again is the one exported: a text alone gives onnxruntime's result.
    np.testing.assert_allclose(run(batch[0]), alone.run(None, batch[0])[0], rtol=1e-4, atol=1e-5, err_msg=name)
    feeds = padded(batch, pad_inputs)
    return lambda mix: run(feeds)


def print_new_mix_split(total: float, parts: dict[str, float], alone: float) -> None:
    """Where the fastest new mix batched spent its time (``SessionStats``), and how fast its
    template runs alone would be against onnxruntime one text at a time over that mix
    (``alone``): batching step by step cannot beat that ratio however cheap planning and the
    Python between steps become."""
    kernels = parts.get("kernels", 0.0)
    if not kernels:  # it ran as one session, or no new mix was timed
        return
    planning = sum(parts.get(phase, 0.0) for phase in ("build", "analyse", "schedule", "plan"))
    moves = parts.get("gather", 0.0) + parts.get("scatter", 0.0)
    rest = total - planning - kernels - moves
    print(f"  a new mix batched, {total * 1e3:.1f} ms: planning {planning * 1e3:.1f}, template runs (kernels) "
          f"{kernels * 1e3:.1f}, gathers and writes {moves * 1e3:.1f}, the rest {rest * 1e3:.1f}; "
          f"its template runs alone would be {alone / kernels:.2f}x onnxruntime one text at a time")


def main(argv: list[str] | None = None) -> None:
    parser = arguments.parser("python -m benchmarks.exported_models", __doc__.splitlines()[0])
    parser.add_argument("--models", default="lstm,encoder,bert,bert-mask,bert-cls-mask,gpt2,cnn", help=f"some of {','.join(exports.MODELS)}")
    parser.add_argument("--size", type=arguments.integer(1), default=256, help="model width")
    parser.add_argument("--texts", type=arguments.integer(1), default=64)
    parser.add_argument("--repeats", type=arguments.integer(1), default=5)
    parser.add_argument("--json", type=Path, help="write the times here")
    parser.add_argument("--exports", type=Path, help="a folder of the exports, made there by an earlier run "
                        "(PyTorch needed) where missing; by default a temporary one")
    arguments.add_providers(parser)
    args = parser.parse_args(argv)
    names = exports.model_names(parser, args.models)
    providers = arguments.providers(args.providers)
    print(f"onnxruntime on {providers[0]}, {THREADS} threads; fastest of {args.repeats} runs; every batched result checked against onnxruntime alone")
    results = {}
    with tempfile.TemporaryDirectory() as temporary:
        folder = args.exports or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            results[name] = compare(name, args.size, args.texts, args.repeats, folder, providers)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
