"""ReduceMax, ReduceMin, ArgMax and ArgMin as the spec has them (NumPy's: a NaN wins), for the
models we hand to onnxruntime.

onnxruntime's kernels of these ops skip or keep a NaN depending on the shape, and even on the
memory alignment, of their input: one ReduceMax over the same values at other offsets in memory
gave another answer in 320 of 750 runs here. So a batched launch could not agree with the
instance alone, nor the instance with itself. Each such node over floats becomes the op itself
where no NaN is present, and the NaN (or the index of the first or last one) where one is, from
``IsNaN`` of its input reduced the same way: an exact reduction over 0s and 1s.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

NAN_BY_SHAPE = frozenset({"ReduceMax", "ReduceMin", "ArgMax", "ArgMin"})
FLOATS = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16})
MIN_OPSET = 9  # IsNaN and Where


def propagate_nans(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with every top-level ReduceMax, ReduceMin, ArgMax and ArgMin over float input
    made NaN-propagating (the model itself when it has none, or when its opset, before 9, has
    no IsNaN and no Where to write it with)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    if opset < MIN_OPSET or not any(node.op_type in NAN_BY_SHAPE and node.domain in ("", "ai.onnx")
                                    for node in graph.node):
        return model
    types = _elem_types(model)
    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.node[:]
    for k, node in enumerate(graph.node):
        if node.op_type in NAN_BY_SHAPE and node.domain in ("", "ai.onnx") and types.get(node.input[0]) in FLOATS:
            fixed.graph.node.extend(_nan_propagating(node, types[node.input[0]], opset, f"nan{k}", fixed.graph))
        else:
            fixed.graph.node.append(node)
    return fixed


def _nan_propagating(node: onnx.NodeProto, elem_type: int, opset: int, prefix: str,
                     graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    x, out = node.input[0], node.output[0]
    plain, flags, hit, found = f"{prefix}/plain", f"{prefix}/flags", f"{prefix}/hit", f"{prefix}/found"
    nodes = [helper.make_node(node.op_type, list(node.input), [plain], name=node.name or None, **attrs),
             helper.make_node("IsNaN", [x], [f"{prefix}/isnan"]),
             helper.make_node("Cast", [f"{prefix}/isnan"], [flags], to=elem_type)]
    if node.op_type.startswith("Reduce"):  # any NaN in the reduced values: the result is NaN
        nodes.append(helper.make_node("ReduceMax", [flags, *node.input[1:]], [found], **attrs))
        nan = f"{prefix}/nan"
        graph.initializer.append(helper.make_tensor(nan, elem_type, [], [np.nan]))
        replacement = nan
    else:  # the index of the first NaN (the last, with select_last_index), as NumPy's argmax gives
        axis, keepdims = attrs.get("axis", 0), attrs.get("keepdims", 1)
        nodes.append(helper.make_node("ArgMax", [flags], [f"{prefix}/first"], **attrs))
        if opset >= 18:
            axes = f"{prefix}/axes"
            graph.initializer.append(helper.make_tensor(axes, TensorProto.INT64, [1], [axis]))
            nodes.append(helper.make_node("ReduceMax", [flags, axes], [found], keepdims=keepdims))
        else:
            nodes.append(helper.make_node("ReduceMax", [flags], [found], axes=[axis], keepdims=keepdims))
        replacement = f"{prefix}/first"
    zero = f"{prefix}/zero"
    graph.initializer.append(helper.make_tensor(zero, elem_type, [], [0]))
    nodes += [helper.make_node("Greater", [found, zero], [hit]),
              helper.make_node("Where", [hit, replacement, plain], [out])]
    return nodes


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """The element type of each top-level value onnx knows: declared, else inferred."""
    def known(graph: onnx.GraphProto) -> dict[str, int]:
        infos = [*graph.input, *graph.value_info, *graph.output]
        types = {i.name: i.type.tensor_type.elem_type for i in infos if i.type.HasField("tensor_type")}
        types.update((t.name, t.data_type) for t in graph.initializer)
        return types

    types = known(model.graph)
    if any(n.op_type in NAN_BY_SHAPE and n.input[0] not in types for n in model.graph.node):
        try:
            types.update(known(onnx.shape_inference.infer_shapes(model).graph))
        except (onnx.shape_inference.InferenceError, RuntimeError):
            pass  # a node whose input type stays unknown is left as it is
    return types
