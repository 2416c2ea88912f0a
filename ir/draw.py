"""Pictures of a graph and of its batch plan: PNG or SVG with matplotlib, or Graphviz DOT.

With a plan, each launch is a row (the order they run in, top to bottom) holding the nodes it
runs together, each node coloured by its signature class, each edge labelled with the shape it
carries. Past ``MAX_DRAWN_NODES`` nodes a picture of every node is unreadable: then each
signature class is one box (its op, its nodes and its launches) with edges between classes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from autobatch.ir.graph import Graph

MAX_DRAWN_NODES = 300
PALETTE = ("#8ecae6", "#ffb703", "#90be6d", "#f28482", "#cdb4db", "#f9c74f", "#84a59d", "#b5838d", "#a3c4f3",
           "#ffd6a5", "#bde0fe", "#e9c46a", "#caffbf", "#ffadad", "#d0f4de", "#fcf6bd")
ALONE = "#dddddd"  # a node no rule batches


@dataclass
class PlanView:
    """What a picture shows of a plan: per node its signature class (absent: run alone), and
    the launches in order (node ids)."""

    classes: dict[int, int]
    launches: list[list[int]]


def draw_graph(graph: Graph, path: str, plan: PlanView | None = None) -> None:
    if not str(path).endswith((".png", ".svg", ".dot")):
        raise ValueError(f"{path}: draw to a .png, .svg or .dot file")
    plan = plan or PlanView({}, [[node_id] for node_id in _topological(graph)])
    picture = _summary(graph, plan) if len(graph) > MAX_DRAWN_NODES else _every_node(graph, plan)
    if str(path).endswith(".dot"):
        with open(path, "w") as f:
            f.write(_dot(picture))
    else:
        _render(picture, path)


@dataclass
class _Picture:
    title: str
    boxes: dict[int, tuple[str, str, int]]  # id -> (label, colour, row)
    edges: dict[tuple[int, int], str]  # (from, to) -> label
    rows: list[str]  # a caption per row


def _topological(graph: Graph) -> list[int]:
    return [node.id for node in graph.topological_order()]


def _shape(graph: Graph, value: str) -> str:
    vtype = graph.values[value].type
    if vtype is None or vtype.shape is None:
        return ""
    return "x".join("?" if d is None else str(d) for d in vtype.shape) or "scalar"


def _colour(cls: int | None) -> str:
    return ALONE if cls is None else PALETTE[cls % len(PALETTE)]


def _every_node(graph: Graph, plan: PlanView) -> _Picture:
    boxes, rows = {}, []
    for row, launch in enumerate(plan.launches):
        cls = plan.classes.get(launch[0])
        for node_id in launch:
            boxes[node_id] = (graph.nodes[node_id].op_type, _colour(cls), row)
        rows.append(f"launch {row + 1}: {len(launch)} x {graph.nodes[launch[0]].op_type}")
    edges = {}
    for node in graph.nodes.values():
        for name in graph.reads(node):
            source = graph.producer_of(name)
            if source is not None:
                edges[source[0], node.id] = _shape(graph, name)
    launches = len(plan.launches)
    return _Picture(f"{len(graph)} nodes in {launches} launches (a row a launch, a colour a signature class)",
                    boxes, edges, rows)


def _summary(graph: Graph, plan: PlanView) -> _Picture:
    """One box a signature class (nodes run alone: one box an op), rows by first launch."""
    group_of: dict[int, tuple] = {}
    first: dict[tuple, tuple[int, int]] = {}  # group -> (its first launch, a member)
    launches: Counter[tuple] = Counter()
    for row, launch in enumerate(plan.launches):
        for node_id in launch:
            cls = plan.classes.get(node_id)
            group = ("class", cls) if cls is not None else ("alone", graph.nodes[node_id].op_type)
            group_of[node_id] = group
            first.setdefault(group, (row, node_id))
        launches[group_of[launch[0]]] += 1
    members = Counter(group_of.values())
    order = sorted(members, key=lambda group: first[group][0])
    index = {group: k for k, group in enumerate(order)}
    boxes = {}
    for group in order:
        node = graph.nodes[first[group][1]]
        counts = Counter(_shape(graph, name) for name in node.inputs if name and not graph.values[name].is_shared)
        shapes = ", ".join(shape if n == 1 else f"{shape} x{n}" for shape, n in counts.items())
        kind = "run alone" if group[0] == "alone" else f"{launches[group]} launches"
        boxes[index[group]] = (f"{node.op_type}({shapes})\n{members[group]} nodes, {kind}",
                               _colour(group[1] if group[0] == "class" else None), index[group])
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for node in graph.nodes.values():
        for name in graph.reads(node):
            source = graph.producer_of(name)
            if source is not None and group_of[source[0]] != group_of[node.id]:
                counts[index[group_of[source[0]]], index[group_of[node.id]]] += 1
    edges = {pair: f"{count} values" for pair, count in counts.items()}
    return _Picture(f"{len(graph)} nodes in {len(plan.launches)} launches: a box a signature class", boxes, edges,
                    ["" for _ in order])


def _dot(picture: _Picture) -> str:
    lines = ["digraph plan {", f'  label="{picture.title}"; labelloc=t; rankdir=TB;',
             '  node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=10];',
             "  edge [fontname=Helvetica, fontsize=8];"]
    by_row: dict[int, list[int]] = defaultdict(list)
    for box, (_, _, row) in picture.boxes.items():
        by_row[row].append(box)
    for row, boxes in sorted(by_row.items()):
        caption = picture.rows[row] if row < len(picture.rows) else ""
        lines.append(f'  subgraph cluster_{row} {{ label="{caption}"; style=dashed; rank=same;')
        for box in boxes:
            label, colour, _ = picture.boxes[box]
            lines.append(f'    n{box} [label="{label}", fillcolor="{colour}"];')
        lines.append("  }")
    lines += [f'  n{a} -> n{b} [label="{label}"];' for (a, b), label in picture.edges.items()]
    return "\n".join(lines + ["}"]) + "\n"


def _render(picture: _Picture, path: str) -> None:
    """Rows of boxes; a row's boxes are labelled only while they fit (its caption names them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout = nx.DiGraph()
    by_row: dict[int, list[int]] = defaultdict(list)
    for box, (_, _, row) in picture.boxes.items():
        by_row[row].append(box)
        layout.add_node(box)
    layout.add_edges_from(picture.edges)
    widest = max(len(boxes) for boxes in by_row.values())
    step = min(1.4, 30 / widest)  # the whole of the widest row in about 30 units
    positions = {box: ((k - (len(boxes) - 1) / 2) * step, -row) for row, boxes in by_row.items()
                 for k, box in enumerate(boxes)}
    labelled = widest <= 12
    size = 900 if labelled else max(20, 400 * step)
    figure, axes = plt.subplots(figsize=(min(18, 6 + widest * step * 0.45), min(30, 1.5 + len(by_row) * 0.6)))
    left = min(x for x, _ in positions.values()) - 1.0
    for row, boxes in by_row.items():  # a launch: a band around the nodes it runs together
        xs = [positions[box][0] for box in boxes]
        axes.add_patch(matplotlib.patches.FancyBboxPatch((min(xs) - step / 2, -row - 0.3), max(xs) - min(xs) + step,
                                                         0.6, boxstyle="round,pad=0.02", fc="none", ec="#aaa", ls="--"))
        if row < len(picture.rows) and picture.rows[row]:
            axes.text(left, -row, picture.rows[row], fontsize=7, va="center", ha="right", color="#333")
    nx.draw_networkx_edges(layout, positions, ax=axes, arrows=True, arrowsize=5, width=0.4, edge_color="#bbb",
                           node_size=size, node_shape="s")
    nx.draw_networkx_nodes(layout, positions, ax=axes, node_color=[picture.boxes[b][1] for b in layout],
                           node_size=size, node_shape="s", edgecolors="#555", linewidths=0.3)
    if labelled:
        nx.draw_networkx_labels(layout, positions, {box: picture.boxes[box][0] for box in layout}, ax=axes, font_size=6)
        if len(picture.edges) <= 60:
            nx.draw_networkx_edge_labels(layout, positions, picture.edges, ax=axes, font_size=5, rotate=False)
    axes.set_title(picture.title, fontsize=9)
    axes.set_axis_off()
    axes.autoscale()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
