"""Recurrent layers: LSTM, GRU and RNN with the full ONNX option set.

Directions (forward / reverse / bidirectional), `layout`, `sequence_lens` (a finished sequence
keeps its last state and emits zeros), initial states, LSTM peepholes and `input_forget`, GRU
`linear_before_reset`, `clip`, and any of the activation functions the spec lists.
The input projection of all time steps is one matrix product; only the recurrence loops.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from autobatch.backends.kernels._util import sigmoid
from autobatch.backends.kernels.registry import NodeContext, kernel

Activation = Callable[[np.ndarray], np.ndarray]
States = tuple[np.ndarray, ...]  # (H,) or (H, C), each (batch, hidden)
Step = Callable[[np.ndarray, States], States]

# name -> (f(x, alpha, beta), default alpha, default beta); a None default means the function
# takes no such parameter, so it consumes nothing from activation_alpha / activation_beta.
# Defaults are those of the ONNX operators of the same name (Affine and ScaledTanh, which
# have none any more, scale by 1).
_ACTIVATIONS: dict[str, tuple[Callable[[np.ndarray, float, float], np.ndarray], float | None, float | None]] = {
    "sigmoid": (lambda x, a, b: sigmoid(x), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x > a, x, 0).astype(x.dtype), 1.0, None),
    "elu": (lambda x, a, b: np.where(x > 0, x, a * np.expm1(x)), 1.0, None),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
}


def _activations(ctx: NodeContext, defaults: Sequence[str], num_directions: int) -> list[list[Activation]]:
    """Per direction, the activation functions; alphas/betas are consumed in order by the
    functions that take them (onnxruntime's reading of the spec)."""
    names = ctx.get("activations") or list(defaults) * num_directions
    alphas, betas = iter(ctx.get("activation_alpha") or []), iter(ctx.get("activation_beta") or [])
    functions: list[Activation] = []
    for name in names:
        fn, alpha, beta = _ACTIVATIONS[name.lower()]
        alpha = next(alphas, alpha) if alpha is not None else 0.0
        beta = next(betas, beta) if beta is not None else 0.0
        functions.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    per_direction = len(defaults)
    return [functions[d * per_direction : (d + 1) * per_direction] for d in range(num_directions)]


@dataclass(frozen=True)
class _Direction:
    """The parameters of one direction, with the input projection's weights split off."""

    w: np.ndarray  # (gates * hidden, input)
    r: np.ndarray  # (gates * hidden, hidden)
    wb: np.ndarray  # (gates * hidden,)
    rb: np.ndarray  # (gates * hidden,)
    activations: list[Activation]
    clip: Callable[[np.ndarray], np.ndarray]


def _clipper(ctx: NodeContext) -> Callable[[np.ndarray], np.ndarray]:
    threshold = ctx.get("clip")
    if threshold is None:
        return lambda x: x
    return lambda x: np.clip(x, -threshold, threshold)


def _directions(ctx: NodeContext, w: np.ndarray, r: np.ndarray, b: np.ndarray | None, defaults: Sequence[str]) -> list[_Direction]:
    num_directions, gate_rows = w.shape[0], w.shape[1]
    if b is None:
        b = np.zeros((num_directions, 2 * gate_rows), dtype=w.dtype)
    activations = _activations(ctx, defaults, num_directions)
    clip = _clipper(ctx)
    return [
        _Direction(w[d], r[d], b[d, :gate_rows], b[d, gate_rows:], activations[d], clip)
        for d in range(num_directions)
    ]


def _scan(step: Step, projected: np.ndarray, states: States, lengths: np.ndarray | None, reverse: bool) -> tuple[np.ndarray, States]:
    """Run `step` over time; a sequence past its length keeps its state and outputs zeros (its
    rows are left out of the step: a batch of sequences of many lengths costs their rows only)."""
    seq_len = projected.shape[0]
    hidden = states[0]
    y = np.zeros((seq_len, *hidden.shape), dtype=hidden.dtype)
    if lengths is not None:
        states = tuple(np.array(s) for s in states)  # updated row by row below: our own copies
        lengths = np.asarray(lengths)
    for t in reversed(range(seq_len)) if reverse else range(seq_len):
        if lengths is None or (t < lengths).all():
            states = step(projected[t], states)
            y[t] = states[0]
            continue
        active = np.flatnonzero(t < lengths)
        if len(active):
            new = step(projected[t][active], tuple(s[active] for s in states))
            for state, value in zip(states, new):
                state[active] = value
            y[t, active] = new[0]
    return y, states


def _run_layer(
    ctx: NodeContext,
    x: np.ndarray,
    directions: list[_Direction],
    make_step: Callable[[_Direction, int], Step],
    initial: Sequence[np.ndarray | None],
    sequence_lens: np.ndarray | None,
) -> tuple[np.ndarray, ...]:
    """Common driver: layout, directions, initial states; returns Y and the final states."""
    batch_first = bool(ctx.get("layout", 0))
    if batch_first:  # (batch, seq, ...) -> (seq, batch, ...); states (batch, dir, h) -> (dir, batch, h)
        x = x.swapaxes(0, 1)
        initial = [None if s is None else s.swapaxes(0, 1) for s in initial]
    hidden = directions[0].r.shape[1]
    zeros = np.zeros((len(directions), x.shape[1], hidden), dtype=x.dtype)
    initial = [zeros if s is None else s for s in initial]
    backward = ctx.get("direction", "forward") == "reverse"
    ys, finals = [], []
    for d, direction in enumerate(directions):
        projected = x @ direction.w.T + direction.wb  # all time steps at once
        y, states = _scan(make_step(direction, d), projected, tuple(s[d] for s in initial), sequence_lens, reverse=backward or d == 1)
        ys.append(y)
        finals.append(states)
    y_all = np.stack(ys, axis=1)  # (seq, dir, batch, hidden)
    final_states = [np.stack([f[i] for f in finals]) for i in range(len(initial))]
    if batch_first:
        y_all = y_all.transpose(2, 0, 1, 3)
        final_states = [s.swapaxes(0, 1) for s in final_states]
    return tuple(v.astype(x.dtype, copy=False) for v in (y_all, *final_states))


# --------------------------------------------------------------------------- LSTM


def _lstm_step(ctx: NodeContext, p: np.ndarray | None) -> Callable[[_Direction, int], Step]:
    input_forget = bool(ctx.get("input_forget", 0))

    def make(direction: _Direction, d: int) -> Step:
        f, g, h = direction.activations
        clip = direction.clip
        hidden = direction.r.shape[1]
        peep_i, peep_o, peep_f = (0, 0, 0) if p is None else np.split(p[d], 3)

        def step(x_t: np.ndarray, states: States) -> States:
            h_prev, c_prev = states
            gates = x_t + h_prev @ direction.r.T + direction.rb
            i, o, fg, c = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
            i = f(clip(i + peep_i * c_prev))
            # input_forget couples the gates: what is not written is kept.
            fg = 1 - i if input_forget else f(clip(fg + peep_f * c_prev))
            c_new = fg * c_prev + i * g(clip(c))
            o = f(clip(o + peep_o * c_new))
            return o * h(c_new), c_new

        return step

    return make


@kernel("LSTM", 7, 14, 22)
def lstm(
    ctx: NodeContext,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    p: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    directions = _directions(ctx, w, r, b, ("Sigmoid", "Tanh", "Tanh"))
    return _run_layer(ctx, x, directions, _lstm_step(ctx, p), [initial_h, initial_c], sequence_lens)


# --------------------------------------------------------------------------- GRU


def _gru_step(ctx: NodeContext) -> Callable[[_Direction, int], Step]:
    linear_before_reset = bool(ctx.get("linear_before_reset", 0))

    def make(direction: _Direction, d: int) -> Step:
        f, g = direction.activations
        clip = direction.clip
        hidden = direction.r.shape[1]
        r_zr, r_h = direction.r[: 2 * hidden].T, direction.r[2 * hidden :].T
        rb_zr, rb_h = direction.rb[: 2 * hidden], direction.rb[2 * hidden :]

        def step(x_t: np.ndarray, states: States) -> States:
            (h_prev,) = states
            zr = x_t[:, : 2 * hidden] + h_prev @ r_zr + rb_zr
            z, reset = f(clip(zr[:, :hidden])), f(clip(zr[:, hidden:]))
            if linear_before_reset:
                recurrent = reset * (h_prev @ r_h + rb_h)
            else:
                recurrent = (reset * h_prev) @ r_h + rb_h
            candidate = g(clip(x_t[:, 2 * hidden :] + recurrent))
            return ((1 - z) * candidate + z * h_prev,)

        return step

    return make


@kernel("GRU", 7, 14, 22)
def gru(
    ctx: NodeContext,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    directions = _directions(ctx, w, r, b, ("Sigmoid", "Tanh"))
    return _run_layer(ctx, x, directions, _gru_step(ctx), [initial_h], sequence_lens)


# --------------------------------------------------------------------------- RNN


def _rnn_step(direction: _Direction, d: int) -> Step:
    (f,) = direction.activations

    def step(x_t: np.ndarray, states: States) -> States:
        return (f(direction.clip(x_t + states[0] @ direction.r.T + direction.rb)),)

    return step


@kernel("RNN", 7, 14, 22)
def rnn(
    ctx: NodeContext,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
) -> tuple[np.ndarray, ...]:
    directions = _directions(ctx, w, r, b, ("Tanh",))
    return _run_layer(ctx, x, directions, _rnn_step, [initial_h], sequence_lens)
