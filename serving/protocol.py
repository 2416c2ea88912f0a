"""Open Inference Protocol v2 (KServe v2 / Triton HTTP) bodies: JSON tensors, and Triton's
binary tensor extension (what tritonclient sends by default): a JSON header of
``Inference-Header-Content-Length`` bytes followed by the raw tensors in order."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from autobatch.arrays import array_from_json
from autobatch.serving.errors import BadRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
DATATYPES: dict[str, np.dtype] = {
    name: np.dtype(dtype) for name, dtype in (
        ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32), ("UINT64", np.uint64),
        ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32), ("INT64", np.int64),
        ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64))
}
_NAMES = {dtype: name for name, dtype in DATATYPES.items()}


def datatype_of(dtype: np.dtype) -> str:
    return _NAMES.get(np.dtype(dtype), "BYTES")


@dataclass
class InferRequest:
    feeds: dict[str, np.ndarray]
    outputs: list[str] | None  # None: all of the model's outputs
    binary_outputs: set[str]  # outputs to send back as raw bytes
    id: str | None = None


def decode_request(body: bytes, header_length: str | None = None) -> InferRequest:
    """The feeds of one instance; BadRequest naming what is wrong otherwise."""
    try:
        split = int(header_length) if header_length is not None else len(body)
    except ValueError:
        raise BadRequest(f"{HEADER_LENGTH} is not an integer") from None
    if not 0 <= split <= len(body):
        raise BadRequest(f"{HEADER_LENGTH} {split} is outside the body of {len(body)} bytes")
    try:
        request = json.loads(body[:split])
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequest(f"malformed JSON: {error}") from None
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
        raise BadRequest("the body must be a JSON object with a list of 'inputs'")
    binary, offset = memoryview(body)[split:], 0
    feeds = {}
    for tensor in request["inputs"]:
        name, array, used = _decode_tensor(tensor, binary[offset:])
        if name in feeds:
            raise BadRequest(f"input {name!r} given twice")
        feeds[name], offset = array, offset + used
    if offset != len(binary):
        raise BadRequest(f"{len(binary) - offset} bytes of binary data left over")
    outputs, binary_outputs = _requested_outputs(request.get("outputs"), _parameters(request))
    request_id = request.get("id")
    return InferRequest(feeds, outputs, binary_outputs, str(request_id) if request_id is not None else None)


def _decode_tensor(tensor: Any, binary: memoryview) -> tuple[str, np.ndarray, int]:
    """(name, array, binary bytes used) of one input tensor."""
    if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
        raise BadRequest("each input must be an object with a 'name'")
    name = tensor["name"]
    datatype = tensor.get("datatype")
    dtype = DATATYPES.get(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise BadRequest(f"input {name!r}: datatype {tensor.get('datatype')!r} is not one of {sorted(DATATYPES)}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: 'shape' must be a list of non-negative integers")
    size = math.prod(shape)  # Python ints: a NumPy product of a hostile shape wraps around
    binary_size = _parameters(tensor).get("binary_data_size")
    try:
        if binary_size is not None:
            if not isinstance(binary_size, int) or binary_size != size * dtype.itemsize or binary_size > len(binary):
                raise BadRequest(f"input {name!r}: binary_data_size {binary_size!r} does not fit shape {shape} "
                                 f"of {tensor['datatype']} ({len(binary)} bytes left)")
            return name, np.frombuffer(binary[:binary_size], dtype).reshape(shape).copy(), binary_size
        if "data" not in tensor:
            raise BadRequest(f"input {name!r} has no 'data'")
        data = array_from_json(tensor["data"], dtype)
        if data.size != size:
            raise BadRequest(f"input {name!r}: {data.size} values for shape {shape}")
        return name, data.reshape(shape), 0
    except (ValueError, TypeError, OverflowError) as error:  # ragged or odd data
        raise BadRequest(f"input {name!r}: {error}") from None
    except RecursionError:
        raise BadRequest(f"input {name!r}: 'data' nested too deeply") from None


def _requested_outputs(outputs: Any, parameters: dict[str, Any]) -> tuple[list[str] | None, set[str]]:
    if outputs is None:
        return None, set()
    if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs):
        raise BadRequest("'outputs' must be a list of objects with a 'name'")
    all_binary = bool(parameters.get("binary_data_output", False))
    binary = {o["name"] for o in outputs if _parameters(o).get("binary_data", all_binary)}
    return [o["name"] for o in outputs], binary


def _parameters(item: dict[str, Any]) -> dict[str, Any]:
    parameters = item.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise BadRequest("'parameters' must be an object")
    return parameters


def encode_response(model: str, request: InferRequest, outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers; binary outputs follow the JSON header."""
    tensors, chunks = [], []
    for name, value in outputs.items():
        value = np.ascontiguousarray(value)
        tensor: dict[str, Any] = {"name": name, "shape": list(value.shape), "datatype": datatype_of(value.dtype)}
        if name in request.binary_outputs:
            raw = value.tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = value.ravel().tolist()
        tensors.append(tensor)
    response: dict[str, Any] = {"model_name": model, "outputs": tensors}
    if request.id is not None:
        response["id"] = request.id
    header = json.dumps(response).encode()
    if not chunks:
        return header, {}
    return header + b"".join(chunks), {HEADER_LENGTH: str(len(header))}
