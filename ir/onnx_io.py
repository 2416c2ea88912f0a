"""ONNX import and export: ``from_onnx(model | path | bytes) -> Graph``, ``to_onnx(Graph)``.

Import refuses unsafe or inconsistent input with :class:`OnnxImportError`: bytes that are not
a model, external tensor data outside the model's own folder, tensors whose declared size does
not match the data they hold.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto, external_data_helper, helper

from autobatch.ir.errors import OnnxImportError, ValidationError
from autobatch.ir.graph import Graph
from autobatch.ir.nodes import subgraphs_of
from autobatch.ir.types import ValueType

ModelSource = ModelProto | bytes | str | os.PathLike


def load_model(source: ModelSource) -> ModelProto:
    """Parse and check a model, with its external data read safely from its own folder."""
    base_dir: Path | None = None
    if isinstance(source, ModelProto):
        model = source
    else:
        if isinstance(source, bytes):
            data, what = source, "the given bytes"
        else:
            path = Path(source)
            if not path.is_file():
                raise OnnxImportError(f"{path}: no such file")
            data, what, base_dir = path.read_bytes(), str(path), path.resolve().parent
        model = _parse(data, what)
    _check_tensor_sizes(model)
    _check_opsets(model)
    _check_loops(model.graph)
    _load_external_data(model, base_dir)
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError) as error:  # its context on lines of their own: one line
        raise OnnxImportError(f"invalid ONNX model: {' '.join(str(error).split())}") from None
    return model


# The newest opset of each ONNX domain the installed onnx defines (its release's row).
_, _, _, _ML_OPSET, _TRAINING_OPSET = helper.VERSION_TABLE[-1]
NEWEST_OPSETS = {"": onnx.defs.onnx_opset_version(), "ai.onnx": onnx.defs.onnx_opset_version(),
                 "ai.onnx.ml": _ML_OPSET, "ai.onnx.training": _TRAINING_OPSET}


def _check_opsets(model: ModelProto) -> None:
    """Refuse an opset of an ONNX domain that the installed onnx does not define: no op of it
    has a schema here, so nothing could check or run it."""
    for opset in model.opset_import:
        newest = NEWEST_OPSETS.get(opset.domain)
        if newest is not None and not 1 <= opset.version <= newest:
            raise OnnxImportError(f"opset {opset.version} of domain {opset.domain or 'ai.onnx'!r} is not one this onnx "
                                  f"{onnx.__version__} defines (1 to {newest})")


def _check_loops(graph: onnx.GraphProto) -> None:
    """Refuse a Loop given neither a trip count nor a condition: by the spec it never ends."""
    for node in graph.node:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx") and not any(node.input[:2]):
            raise OnnxImportError(f"Loop {node.name or node.output[0]!r} has neither a trip count nor a condition: "
                                  "it would never end")
        for sub in subgraphs_of(node):
            _check_loops(sub)


def _parse(data: bytes, what: str) -> ModelProto:
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeWarning) as error:
        raise OnnxImportError(f"{what} is not an ONNX model (truncated or garbage bytes: {error})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise OnnxImportError(f"{what} is not an ONNX model (no graph or no opset_import)")
    return model


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every tensor of the model: initializers and tensor attributes, in subgraphs and functions too."""
    yield from external_data_helper._get_all_tensors(model)
    for function in model.functions:
        for node in function.node:
            yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[TensorProto]:
    for attr in node.attribute:
        if attr.HasField("t"):
            yield attr.t
        yield from attr.tensors
    for graph in subgraphs_of(node):
        yield from graph.initializer
        for sub in graph.node:
            yield from _node_tensors(sub)


def _check_tensor_sizes(model: ModelProto) -> None:
    """Refuse tensors whose dims promise more elements than their data can hold, before any
    code tries to allocate them."""
    for tensor in _all_tensors(model):
        if any(d < 0 for d in tensor.dims):
            raise OnnxImportError(f"tensor {tensor.name!r} has a negative dimension: {list(tensor.dims)}")
        if tensor.data_location == TensorProto.EXTERNAL:
            continue  # checked against the file when it is read
        declared = int(np.prod(tensor.dims, dtype=object)) if tensor.dims else 1
        # Sub-byte types pack several elements into a byte or an int32 entry; otherwise an
        # entry holds at most two (complex types use two entries an element, so this bounds).
        capacity = _stored_entries(tensor) * (8 if tensor.data_type in _SUB_BYTE_TYPES else 2)
        if declared > capacity:
            raise OnnxImportError(
                f"tensor {tensor.name!r} declares shape {list(tensor.dims)} ({declared} elements) "
                f"but holds data for at most {capacity}"
            )


_SUB_BYTE_TYPES = frozenset(
    getattr(TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2") if hasattr(TensorProto, name)
)


def _stored_entries(tensor: TensorProto) -> int:
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    return sum(
        len(field)
        for field in (tensor.float_data, tensor.int32_data, tensor.int64_data, tensor.double_data,
                      tensor.uint64_data, tensor.string_data)
    )


def _load_external_data(model: ModelProto, base_dir: Path | None) -> None:
    external = [t for t in _all_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    if not external:
        return
    if base_dir is None:
        raise OnnxImportError(
            f"tensor {external[0].name!r} keeps its data in an external file; load the model from its path"
        )
    for tensor in external:
        info = external_data_helper.ExternalDataInfo(tensor)
        location = Path(info.location)
        target = (base_dir / location).resolve()
        if location.is_absolute() or not target.is_relative_to(base_dir):
            raise OnnxImportError(
                f"tensor {tensor.name!r}: external data location {info.location!r} is outside the "
                f"model's folder {str(base_dir)!r}; refused"
            )
        if not target.is_file():
            raise OnnxImportError(f"tensor {tensor.name!r}: external data file {str(target)!r} not found")
        size = target.stat().st_size
        offset = info.offset or 0
        length = info.length if info.length is not None else size - offset
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        declared = int(np.prod(tensor.dims, dtype=object)) * itemsize
        if offset + length > size or length != declared:
            raise OnnxImportError(
                f"tensor {tensor.name!r}: external data asks for {length} bytes at offset {offset} of "
                f"{str(target)!r} ({size} bytes), shape {list(tensor.dims)} needs {declared}"
            )
        with open(target, "rb") as f:
            f.seek(offset)
            tensor.raw_data = f.read(length)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT


def inferred_types(model: ModelProto) -> dict[str, ValueType]:
    """Types of every value of the main graph that ONNX shape inference can derive."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError):
        inferred = model  # keep the declared types only; the interpreter still runs
    graph = inferred.graph
    infos = list(graph.input) + list(graph.value_info) + list(graph.output)
    return {info.name: ValueType(info.type) for info in infos if info.type.ByteSize()}


def from_onnx(source: ModelSource) -> Graph:
    """Import an ONNX model into the IR. Initializers become shared values."""
    model = load_model(source)
    opsets = {o.domain: o.version for o in model.opset_import}
    if "ai.onnx" in opsets:  # both spellings name the default domain
        opsets.setdefault("", opsets.pop("ai.onnx"))
    graph = _import_graph(model.graph, opsets, {(f.domain, f.name): f for f in model.functions},
                          inferred_types(model))
    graph.meta = {
        "ir_version": model.ir_version,
        "producer_name": model.producer_name,
        "producer_version": model.producer_version,
        "domain": model.domain,
        "model_version": model.model_version,
        "doc_string": model.doc_string,
        "graph_doc_string": model.graph.doc_string,
        "metadata_props": {p.key: p.value for p in model.metadata_props},
    }
    return graph


def subgraph_from_onnx(body: onnx.GraphProto, outer: Graph, captured: Sequence[str]) -> Graph:
    """A control-flow body of ``outer`` as a graph of its own: the values it reads from the
    enclosing scope (``captured``) become inputs after its own."""
    proto = onnx.GraphProto()
    proto.CopyFrom(body)
    for name in captured:
        value = outer.values.get(name)
        vtype = value.type if value is not None else None
        proto.input.append(helper.make_value_info(name, vtype.proto) if vtype is not None
                           else helper.make_empty_tensor_value_info(name))
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid(d, v) for d, v in outer.opset_imports.items()],
                              functions=list(outer.functions.values()))
    return _import_graph(proto, dict(outer.opset_imports), dict(outer.functions), inferred_types(model))


def _import_graph(proto: onnx.GraphProto, opsets: dict[str, int], functions: dict, types: dict[str, ValueType]) -> Graph:
    graph = Graph(proto.name or "graph", opsets)
    graph.functions = functions
    if proto.sparse_initializer:
        raise OnnxImportError("sparse initializers are not supported; densify them first")
    initializer_names = set()
    for tensor in proto.initializer:
        try:
            array = onnx.numpy_helper.to_array(tensor)
        except (ValueError, TypeError) as error:
            raise OnnxImportError(f"initializer {tensor.name!r} cannot be read: {error}") from None
        graph.add_initializer(tensor.name, array)
        initializer_names.add(tensor.name)
    for info in proto.input:
        if info.name not in initializer_names:  # old models list initializers as inputs too
            graph.add_input(info.name, ValueType(info.type))
    for node in proto.node:
        domain = "" if node.domain == "ai.onnx" else node.domain
        try:
            graph.add_node(
                node.op_type, list(node.input), list(node.output),
                {a.name: a for a in node.attribute}, domain=domain,
                version=opsets.get(domain, 1), name=node.name,
                output_types=[types.get(o) for o in node.output],
            )
        except ValidationError as error:
            raise OnnxImportError(f"node {node.name or node.op_type!r}: {error}") from None
    for info in proto.output:
        graph.add_output(info.name)
        value = graph.values[info.name]
        if info.type.ByteSize() and value.const is None:
            value.type = ValueType(info.type)
    graph.validate()
    return graph


def to_onnx(graph: Graph, check: bool = True, data_limit: int | None = None) -> ModelProto:
    """Export the IR as an ONNX model that ``onnx.checker`` accepts and onnxruntime loads.
    ``data_limit``: constants with more elements are declared as typed graph inputs, without
    their data: a model for shape inference only (it reads the values of small constants, such
    as shapes, and the types of the rest), which then skips copying and parsing the weights."""

    def info(name: str) -> onnx.ValueInfoProto:
        value = graph.values[name]
        if value.type is None:
            return helper.make_empty_tensor_value_info(name)
        return helper.make_value_info(name, value.type.proto)

    nodes = []
    for node in graph.topological_order():
        proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name or None,
                                 domain=node.domain or None)
        proto.attribute.extend(node.attributes.values())
        nodes.append(proto)
    io_names = set(graph.inputs) | set(graph.outputs)
    value_info = [
        info(name) for name, value in graph.values.items()
        if name not in io_names and value.const is None and value.type is not None
    ]
    constants = graph.initializers()
    typed_only = {name: array for name, array in constants.items() if data_limit is not None and array.size > data_limit}
    initializers = [onnx.numpy_helper.from_array(array, name) for name, array in constants.items()
                    if name not in typed_only]
    inputs = [info(n) for n in graph.inputs]
    inputs += [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
               for name, array in typed_only.items()]
    proto_graph = helper.make_graph(
        nodes, graph.name, inputs, [info(n) for n in graph.outputs],
        initializer=initializers, value_info=value_info, doc_string=graph.meta.get("graph_doc_string") or None,
    )
    opsets = [helper.make_opsetid(domain, version) for domain, version in sorted(graph.opset_imports.items())]
    model = helper.make_model(proto_graph, opset_imports=opsets, functions=list(graph.functions.values()))
    meta = graph.meta
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        if meta.get(field):
            setattr(model, field, meta[field])
    helper.set_model_props(model, meta.get("metadata_props", {}))
    model.ir_version = choose_ir_version(model, meta.get("ir_version"))
    _type_untyped_outputs(model)
    if check:
        onnx.checker.check_model(model)
    return model


def _type_untyped_outputs(model: ModelProto) -> None:
    """Graph outputs must carry a type in ONNX; take it from shape inference where it is missing."""
    untyped = [o for o in model.graph.output if not o.type.ByteSize()]
    if not untyped:
        return
    types = inferred_types(model)
    for output in untyped:
        if output.name in types:
            output.type.CopyFrom(types[output.name].proto)


def choose_ir_version(model: ModelProto, original: int | None) -> int:
    """The model's own IR version, raised to what its opsets need (and to 4), and lowered to
    what the installed onnxruntime accepts."""
    # IR 4 at least: before it every initializer had to be a graph input too, which ``to_onnx``
    # does not write (onnxruntime and the checker refuse such an IR 3 model).
    needed = max(helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True), 4)
    if model.functions:
        needed = max(needed, 8)  # model-local functions arrived with IR 8
    wanted = max(needed, original or needed)
    return max(needed, min(wanted, max_onnxruntime_ir_version()))


@functools.cache
def max_onnxruntime_ir_version() -> int:
    """The highest IR version the installed onnxruntime loads (probed once: onnxruntime
    exposes no constant for it); onnx's own when onnxruntime is absent."""
    try:
        import onnxruntime
    except ImportError:
        return onnx.IR_VERSION
    for version in range(onnx.IR_VERSION, 3, -1):
        probe = helper.make_model(
            helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])]),
            opset_imports=[helper.make_opsetid("", 13)],
        )
        probe.ir_version = version
        try:
            onnxruntime.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
            return version
        except Exception:  # onnxruntime raises its own Fail type for an unsupported IR version
            continue
    return onnx.IR_VERSION
