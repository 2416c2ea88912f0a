"""Drawing a small graph to PNG or SVG with matplotlib (layers = topological generations)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

if TYPE_CHECKING:
    from autobatch.ir.graph import Graph

MAX_DRAWN_NODES = 500


def draw_graph(graph: Graph, path: str) -> None:
    if len(graph) > MAX_DRAWN_NODES:
        raise ValueError(f"graph has {len(graph)} nodes; drawing is for graphs of at most {MAX_DRAWN_NODES}")
    if not str(path).endswith((".png", ".svg")):
        raise ValueError(f"{path}: draw to a .png or .svg file")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layout_graph = nx.DiGraph(graph.nx)
    for layer, ids in enumerate(nx.topological_generations(layout_graph)):
        for node_id in ids:
            layout_graph.nodes[node_id]["layer"] = layer
    positions = nx.multipartite_layout(layout_graph, subset_key="layer", align="horizontal")
    positions = {n: (x, -y) for n, (x, y) in positions.items()}
    labels = {n: graph.nodes[n].op_type for n in layout_graph}
    depth = max((d["layer"] for _, d in layout_graph.nodes(data=True)), default=0) + 1
    figure, axes = plt.subplots(figsize=(max(4, len(graph) ** 0.5 * 2), max(3, depth * 0.9)))
    nx.draw_networkx(layout_graph, positions, labels=labels, ax=axes, node_color="#cde",
                     node_size=900, font_size=7, arrows=True)
    axes.set_axis_off()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
