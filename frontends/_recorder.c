/* The compiled hot path of tracing (issue 19): what every traced op and cell call runs.

   frontends/recorder.py holds the same classes in Python, which run where this does not build
   (no compiler) or when AUTOBATCH_PURE_PYTHON is set; both are tested. Each function here
   says which Python function it is. Anything out of the common case (broadcasting, a Python
   scalar operand, a tensor of another batch, a value not known yet that no record computes)
   is handed to the Python code, so the two cannot disagree on it.

   TensorBase: a traced value's fields (the Python `Tensor` subclasses it, adding methods).
   RecorderBase: the records a `Tracer` appends to, and `record_one`, `record_outputs`,
   `record_call`, `_append`, `_outputs_again`.
   CellBase: a cell's call (`cells.Cell._traced_call` in Python).
   operands, elementwise, matmul, pick, lookup: the common cases of `ops`' functions. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

/* ------------------------------------------------------------------ configured from Python */
static PyObject *tensor_class;      /* frontends.tensors.Tensor (a subclass of TensorBase) */
static PyObject *record_class;      /* ir.records.Record (a named tuple) */
static PyObject *no_attributes;     /* tensors.NO_ATTRIBUTES */
static PyObject *no_attributes_id;  /* its id(), made once: most records have no attributes */
static PyObject *tensor_type;       /* tensors.tensor_type(dtype, shape) -> ValueType */
static PyObject *value_type_class;  /* ir.ValueType: a tensor's entry where it is not a shared value's name */
static PyObject *parameter_class;   /* tensors.Parameter */
static PyObject *current_batch_var; /* tensors._current (a ContextVar) */
static PyObject *elementwise_python; /* ops._python_elementwise: everything but the common case */
static PyObject *tensors_python;    /* ops._python_tensors: likewise */
static PyObject *pick_python, *lookup_python;  /* ops._python_pick, ops._python_lookup: likewise */
static PyObject *matmul_python;     /* ops._python_matmul: likewise */
static PyObject *split_python;      /* ops._python_split: likewise */
static PyObject *split_attributes;  /* ops._split_attributes(axis, parts): a Split's attributes, made once */
static PyObject *gather_attributes; /* ops._AXIS_0: a pick's */
static PyObject *int64_type;        /* numpy.int64: a pick's position (``Tracer.constant``'s key) */
static PyObject *concat_python;     /* ops._python_concat: beyond the common case */
static PyObject *axis_attributes;   /* ops._axis(axis): a Concat's attributes, made once an axis */
static PyObject *recurrent_python;  /* ops._python_recurrent: beyond the common case */
static PyObject *recurrent_layers;  /* ops._LAYERS: what a layer's checks found, by op, direction and shapes */
static PyObject *flatten_attributes; /* ops._FROM_AXIS_1: a layer's states' Flatten */

static PyObject *empty_string, *empty_tuple;
static PyObject *str_reads, *str_parameter, *str_traced_call, *str_cell_calls, *str_prepare,
    *str_returns_tuple, *str_as_tensor, *str_scalars, *str_in_cell_body, *str_rows, *str_matmul, *str_parameters,
    *str_gather, *str_split, *str_constant, *str_concat, *dtype_keyword, *str_unsqueeze, *str_flatten, *str_reshape,
    *str_shared_tensors, *str_shared_constant;
static PyObject *str_repeatable, *str_shapes, *str_dtypes, *str_types, *str_shared, *str_op_type, *str_domain,
    *str_entries;

/* ------------------------------------------------------------------ TensorBase */
typedef struct {
    PyObject_HEAD
    PyObject *batch, *name, *shape, *dtype, *value, *entry;
    Py_ssize_t producer;
    PyObject *weakrefs;
} TensorObject;

static PyTypeObject TensorBaseType;

static int tensor_traverse(TensorObject *self, visitproc visit, void *arg) {
    /* not the type: a static base's instances own none (a Python subclass's traverse visits it) */
    Py_VISIT(self->batch);
    Py_VISIT(self->name);
    Py_VISIT(self->shape);
    Py_VISIT(self->dtype);
    Py_VISIT(self->value);
    Py_VISIT(self->entry);
    return 0;
}

static int tensor_clear(TensorObject *self) {
    Py_CLEAR(self->batch);
    Py_CLEAR(self->name);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->dtype);
    Py_CLEAR(self->value);
    Py_CLEAR(self->entry);
    return 0;
}

static void tensor_dealloc(TensorObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL) PyObject_ClearWeakRefs((PyObject *)self);
    tensor_clear(self);
    type->tp_free((PyObject *)self);  /* a Python subclass's own dealloc releases its type */
}

static PyMemberDef tensor_members[] = {
    {"batch", T_OBJECT_EX, offsetof(TensorObject, batch), 0, NULL},
    {"name", T_OBJECT_EX, offsetof(TensorObject, name), 0, NULL},
    {"shape", T_OBJECT_EX, offsetof(TensorObject, shape), 0, NULL},
    {"dtype", T_OBJECT_EX, offsetof(TensorObject, dtype), 0, NULL},
    {"value", T_OBJECT_EX, offsetof(TensorObject, value), 0, NULL},
    {"entry", T_OBJECT_EX, offsetof(TensorObject, entry), 0, NULL},
    {"producer", T_PYSSIZET, offsetof(TensorObject, producer), 0, NULL},
    {NULL},
};

static PyTypeObject TensorBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autobatch.frontends._recorder.TensorBase",
    .tp_basicsize = sizeof(TensorObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A traced value's fields (frontends.tensors.Tensor adds its methods).",
    .tp_traverse = (traverseproc)tensor_traverse,
    .tp_clear = (inquiry)tensor_clear,
    .tp_dealloc = (destructor)tensor_dealloc,
    .tp_weaklistoffset = offsetof(TensorObject, weakrefs),
    .tp_members = tensor_members,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ RecorderBase */
typedef struct {
    PyObject_HEAD
    PyObject *records, *pending, *literals, *calls, *names;
    Py_ssize_t instance, reused_calls;
    char reuse_calls;
} RecorderObject;

static PyTypeObject RecorderBaseType;

static int recorder_traverse(RecorderObject *self, visitproc visit, void *arg) {
    Py_VISIT(self->records);
    Py_VISIT(self->pending);
    Py_VISIT(self->literals);
    Py_VISIT(self->calls);
    Py_VISIT(self->names);
    return 0;
}

static int recorder_clear(RecorderObject *self) {
    Py_CLEAR(self->records);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->literals);
    Py_CLEAR(self->calls);
    Py_CLEAR(self->names);
    return 0;
}

static void recorder_dealloc(RecorderObject *self) {
    PyTypeObject *type = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    type->tp_free((PyObject *)self);  /* a Python subclass's own dealloc releases its type */
}

static int configured(void) {
    if (tensor_class == NULL || record_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "autobatch.frontends._recorder used before configure_records()");
        return 0;
    }
    return 1;
}

static int recorder_ready(RecorderObject *self) {
    if (!configured()) return 0;
    if (self->records == NULL || self->pending == NULL || self->literals == NULL || self->calls == NULL
        || self->names == NULL || !PyList_Check(self->records) || !PyList_Check(self->pending)
        || !PyDict_Check(self->literals) || !PyDict_Check(self->calls) || !PyIter_Check(self->names)) {
        PyErr_SetString(PyExc_RuntimeError, "RecorderBase: _records, _pending (lists), _literals, _calls "
                                            "(dicts) and _names (an iterator) are set by Tracer.__init__");
        return 0;
    }
    return 1;
}

/* A pending tensor ``name`` (a new reference given), output of record ``index``; a weak
   reference to it joins the pending list (``Tracer.run_pending`` runs what is still held). */
static PyObject *pending_tensor(RecorderObject *self, PyObject *name, PyObject *shape, PyObject *dtype,
                                PyObject *vtype, Py_ssize_t index) {
    PyTypeObject *type = (PyTypeObject *)tensor_class;
    TensorObject *tensor = (TensorObject *)type->tp_alloc(type, 0);
    if (tensor == NULL) {
        Py_DECREF(name);
        return NULL;
    }
    tensor->batch = Py_NewRef((PyObject *)self);
    tensor->name = name;
    tensor->shape = Py_NewRef(shape);
    tensor->dtype = Py_NewRef(dtype);
    tensor->value = Py_NewRef(Py_None);
    tensor->entry = Py_NewRef(vtype);
    tensor->producer = index;
    PyObject *ref = PyWeakref_NewRef((PyObject *)tensor, NULL);
    if (ref == NULL || PyList_Append(self->pending, ref) < 0) {
        Py_XDECREF(ref);
        Py_DECREF(tensor);
        return NULL;
    }
    Py_DECREF(ref);
    return (PyObject *)tensor;
}

/* A record's index as an int (a new reference): those below INDEX_INTS made once and shared,
   as Python shares small ints. Every batch numbers its records from 0 again, and a record's
   index and its readers' preds were a new int each (allocated and freed, about two a record). */
#define INDEX_INTS 65536
static PyObject *index_ints[INDEX_INTS];

static PyObject *index_int(Py_ssize_t index) {
    if (index < 0 || index >= INDEX_INTS) return PyLong_FromSsize_t(index);
    if (index_ints[index] == NULL && (index_ints[index] = PyLong_FromSsize_t(index)) == NULL) return NULL;
    return Py_NewRef(index_ints[index]);
}

/* f"t{count}": its digits written here (snprintf was a twentieth of a traced op's time). */
static PyObject *value_name(Py_ssize_t count) {
    char digits[24];
    int n = 0;
    if (count < 0) return PyUnicode_FromFormat("t%zd", count);
    do {
        digits[n++] = (char)('0' + count % 10);
        count /= 10;
    } while (count);
    PyObject *name = PyUnicode_New(n + 1, 127);
    if (name == NULL) return NULL;
    Py_UCS1 *text = PyUnicode_1BYTE_DATA(name);
    text[0] = 't';
    for (int k = 0; k < n; k++) text[k + 1] = (Py_UCS1)digits[n - 1 - k];
    return name;
}

/* A new pending output of record ``index``, named t<n> (n from the tracer's counter). */
static PyObject *new_output(RecorderObject *self, PyObject *shape, PyObject *dtype, PyObject *vtype,
                            Py_ssize_t index) {
    PyObject *number = PyIter_Next(self->names);
    if (number == NULL) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "the tracer's name counter ended");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(number);
    Py_DECREF(number);
    if (count == -1 && PyErr_Occurred()) return NULL;
    PyObject *name = value_name(count);
    if (name == NULL) return NULL;
    return pending_tensor(self, name, shape, dtype, vtype, index);
}

/* The record that ``at`` (an index the calls memo holds) names, borrowed, and its index in
   ``*index``; NULL with an error where it names none. */
static PyObject *record_at(RecorderObject *self, PyObject *at, Py_ssize_t *index) {
    *index = PyLong_AsSsize_t(at);
    if (*index == -1 && PyErr_Occurred()) return NULL;
    PyObject *record = PyList_GetItem(self->records, *index);  /* IndexError where it is not */
    if (record != NULL && (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 4)) {
        PyErr_SetString(PyExc_TypeError, "a record must be a Record");
        return NULL;
    }
    return record;
}

/* ``_outputs_again``: new tensors for the outputs of a call seen before (still pending):
   reading them reads its record's outputs. */
static PyObject *do_outputs_again(RecorderObject *self, PyObject *seen, PyObject *shapes, PyObject *dtypes,
                                  PyObject *types) {
    self->reused_calls++;  /* counted first, as in Python */
    PyObject *at = PyDict_GetItemWithError(self->calls, seen);  /* borrowed */
    if (at == NULL) {
        if (!PyErr_Occurred()) {
            PyObject *key = PyTuple_Pack(1, seen);  /* KeyError(seen), the key whole */
            if (key != NULL) PyErr_SetObject(PyExc_KeyError, key);
            Py_XDECREF(key);
        }
        return NULL;
    }
    Py_ssize_t index;
    PyObject *record = record_at(self, at, &index);
    if (record == NULL) return NULL;
    PyObject *outputs = PySequence_Tuple(PyTuple_GET_ITEM(record, 3));
    PyObject *shape_seq = outputs == NULL ? NULL : PySequence_Tuple(shapes);
    PyObject *dtype_seq = shape_seq == NULL ? NULL : PySequence_Tuple(dtypes);
    PyObject *type_seq = dtype_seq == NULL ? NULL : PySequence_Tuple(types);
    PyObject *tensors = NULL;
    if (type_seq == NULL) goto done;
    Py_ssize_t n = PyTuple_GET_SIZE(outputs), k;  /* zip(): the shortest */
    if (PyTuple_GET_SIZE(shape_seq) < n) n = PyTuple_GET_SIZE(shape_seq);
    if (PyTuple_GET_SIZE(dtype_seq) < n) n = PyTuple_GET_SIZE(dtype_seq);
    if (PyTuple_GET_SIZE(type_seq) < n) n = PyTuple_GET_SIZE(type_seq);
    tensors = PyList_New(n);
    if (tensors == NULL) goto done;
    for (k = 0; k < n; k++) {
        PyObject *shape = PyTuple_GET_ITEM(shape_seq, k), *dtype = PyTuple_GET_ITEM(dtype_seq, k);
        PyObject *vtype = PyTuple_GET_ITEM(type_seq, k), *made = NULL;
        if (vtype == Py_None) {
            PyObject *type_args[] = {dtype, shape};
            vtype = made = PyObject_Vectorcall(tensor_type, type_args, 2, NULL);
            if (vtype == NULL) goto error;
        }
        PyObject *tensor = pending_tensor(self, Py_NewRef(PyTuple_GET_ITEM(outputs, k)), shape, dtype, vtype, index);
        Py_XDECREF(made);
        if (tensor == NULL) goto error;
        PyList_SET_ITEM(tensors, k, tensor);
    }
    goto done;
error:
    Py_CLEAR(tensors);
done:
    Py_XDECREF(outputs);
    Py_XDECREF(shape_seq);
    Py_XDECREF(dtype_seq);
    Py_XDECREF(type_seq);
    return tensors;
}

/* Record(op_type, domain, inputs, outputs, attributes, types, entries, key, preds, instance, ()),
   stealing the references given (NULL ones make it fail after releasing the rest). */
static PyObject *new_record(RecorderObject *self, PyObject *op_type, PyObject *domain, PyObject *inputs,
                            PyObject *outputs, PyObject *attributes, PyObject *types, PyObject *entries,
                            PyObject *key, PyObject *preds) {
    PyObject *fields[11] = {op_type, domain, inputs, outputs, attributes, types, entries, key, preds,
                            PyLong_FromSsize_t(self->instance), Py_NewRef(empty_tuple)};
    int k, missing = 0;
    for (k = 0; k < 11; k++) missing |= fields[k] == NULL;
#if PY_VERSION_HEX < 0x030E0000
    /* made as tuple.__new__(Record, ...) makes it: allocated, then its items set */
    PyTypeObject *type = (PyTypeObject *)record_class;
    PyObject *record = missing ? NULL : type->tp_alloc(type, 11);
    if (record == NULL) {
        for (k = 0; k < 11; k++) Py_XDECREF(fields[k]);
        return NULL;
    }
    for (k = 0; k < 11; k++) PyTuple_SET_ITEM(record, k, fields[k]);
    return record;
#else
    /* tuple.__new__(Record, plain) itself: a tuple's hash cache (3.14) starts unset there */
    PyObject *plain = missing ? NULL : PyTuple_New(11);
    if (plain == NULL) {
        for (k = 0; k < 11; k++) Py_XDECREF(fields[k]);
        return NULL;
    }
    for (k = 0; k < 11; k++) PyTuple_SET_ITEM(plain, k, fields[k]);
    PyObject *args = PyTuple_Pack(1, plain);
    Py_DECREF(plain);
    if (args == NULL) return NULL;
    PyObject *record = PyTuple_Type.tp_new((PyTypeObject *)record_class, args, NULL);
    Py_DECREF(args);
    return record;
#endif
}

/* [item] (a new list holding a new reference to ``item``), or NULL */
static PyObject *list_of_one(PyObject *item) {
    PyObject *list = PyList_New(1);
    if (list != NULL) PyList_SET_ITEM(list, 0, Py_NewRef(item));
    return list;
}

static int is_tensor(PyObject *value) {
    if (PyObject_TypeCheck(value, &TensorBaseType)) return 1;
    PyErr_Format(PyExc_TypeError, "a traced op's operands must be tensors, got %.100s", Py_TYPE(value)->tp_name);
    return 0;
}

/* ``Tracer._operands``: the names of a record's operands, the records it reads (appended to
   ``preds``) and, when ``entries`` is given, their entries; known per-instance values become
   the batch's literals. New references in *names. */
static int read_operands(RecorderObject *self, PyObject *inputs, PyObject **names, PyObject *preds,
                         PyObject **entries) {
    /* a tuple of them: a list's items could move while Python code (``_reads``, a key's __eq__) runs */
    PyObject *seq = PyTuple_CheckExact(inputs) ? Py_NewRef(inputs) : PySequence_Tuple(inputs);
    if (seq == NULL) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "a traced op's inputs must be a sequence of tensors");
        }
        return -1;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(seq), i;
    *names = PyList_New(n);
    if (entries != NULL) *entries = PyTuple_New(n);
    if (*names == NULL || (entries != NULL && *entries == NULL)) goto error;
    for (i = 0; i < n; i++) {
        if (!is_tensor(PyTuple_GET_ITEM(seq, i))) goto error;
        TensorObject *tensor = (TensorObject *)PyTuple_GET_ITEM(seq, i);
        if (tensor->name == NULL || tensor->entry == NULL || tensor->value == NULL) {
            PyErr_SetString(PyExc_AttributeError, "a traced op's operand has no name, entry or value set");
            goto error;
        }
        PyList_SET_ITEM(*names, i, Py_NewRef(tensor->name));
        if (entries != NULL) PyTuple_SET_ITEM(*entries, i, Py_NewRef(tensor->entry));
        if (tensor->value == Py_None) {
            if (tensor->producer >= 0) {
                PyObject *producer = index_int(tensor->producer);
                int failed = producer == NULL || PyList_Append(preds, producer) < 0;
                Py_XDECREF(producer);
                if (failed) goto error;
            } else {  /* an argument of a traced cell, or discarded (which raises): Python's ``_reads`` */
                PyObject *one = PyTuple_Pack(1, (PyObject *)tensor);
                PyObject *read = one == NULL ? NULL : PyObject_CallMethodOneArg((PyObject *)self, str_reads, one);
                Py_XDECREF(one);
                if (read == NULL) goto error;
                Py_DECREF(read);
            }
        } else if (!PyUnicode_CheckExact(tensor->entry)) {  /* per-instance data, not a shared value */
            if (PyDict_SetItem(self->literals, tensor->name, tensor->value) < 0) goto error;
        }
    }
    Py_DECREF(seq);
    return 0;
error:
    Py_DECREF(seq);
    Py_CLEAR(*names);
    if (entries != NULL) Py_CLEAR(*entries);
    return -1;
}

/* id(attributes), a new reference: alive while the records holding it are. */
static PyObject *attributes_id_of(PyObject *attributes) {
    return attributes == no_attributes ? Py_NewRef(no_attributes_id) : PyLong_FromVoidPtr(attributes);
}

/* ``(*head, *names)`` as a tuple: the call as ``reuse_calls`` knows it. */
static PyObject *seen_key(PyObject *const *head, Py_ssize_t heads, PyObject *names) {
    Py_ssize_t n = PyList_GET_SIZE(names), k;
    PyObject *seen = PyTuple_New(heads + n);
    if (seen == NULL) return NULL;
    for (k = 0; k < heads; k++) PyTuple_SET_ITEM(seen, k, Py_NewRef(head[k]));
    for (k = 0; k < n; k++) PyTuple_SET_ITEM(seen, heads + k, Py_NewRef(PyList_GET_ITEM(names, k)));
    return seen;
}

/* ``_outputs_again`` of a one-output call seen before, record ``at`` (what ``calls`` holds):
   a new tensor of its output, without the general path's tuples and second lookup. */
static PyObject *output_again(RecorderObject *self, PyObject *at, PyObject *shape, PyObject *dtype,
                              PyObject *vtype) {
    self->reused_calls++;  /* counted first, as in Python */
    Py_ssize_t index;
    PyObject *record = record_at(self, at, &index);
    if (record == NULL) return NULL;
    PyObject *name = PySequence_GetItem(PyTuple_GET_ITEM(record, 3), 0);
    if (name == NULL) return NULL;
    return pending_tensor(self, name, shape, dtype, vtype, index);
}

/* The common op's record: ONNX's domain, deterministic, every input given, one output.
   ``attributes``: a borrowed dict (NO_ATTRIBUTES for none). ``vtype``: the output's type where the
   caller knows it (borrowed), else NULL: ``tensor_type(dtype, shape)``. */
static PyObject *do_record_one(RecorderObject *self, PyObject *op_type, PyObject *inputs, PyObject *shape,
                               PyObject *dtype, PyObject *attributes, PyObject *vtype) {
    PyObject *names = NULL, *entries = NULL, *seen = NULL, *attributes_id = NULL, *at = NULL;
    PyObject *preds = PyList_New(0), *result = NULL;
    if (vtype != NULL) Py_INCREF(vtype);
    if (preds == NULL || read_operands(self, inputs, &names, preds, &entries) < 0) goto done;
    if (vtype == NULL) {
        PyObject *type_args[] = {dtype, shape};
        vtype = PyObject_Vectorcall(tensor_type, type_args, 2, NULL);
    }
    attributes_id = attributes_id_of(attributes);
    if (vtype == NULL || attributes_id == NULL) goto done;
    if (self->reuse_calls) {  /* as ``Tracer.record`` makes it: either may reuse the other's */
        PyObject *head[] = {op_type, empty_string, attributes_id};
        seen = seen_key(head, 3, names);
        if (seen == NULL) goto done;
        at = index_int(PyList_GET_SIZE(self->records));
        Py_ssize_t calls = PyDict_GET_SIZE(self->calls);
        PyObject *known = at == NULL ? NULL : PyDict_SetDefault(self->calls, seen, at);  /* one lookup */
        if (known == NULL) goto done;
        if (PyDict_GET_SIZE(self->calls) == calls) {  /* a call seen before (not inserted: index ints are shared) */
            result = output_again(self, known, shape, dtype, vtype);
            goto done;
        }
    }
    PyObject *tensor = new_output(self, shape, dtype, vtype, PyList_GET_SIZE(self->records));
    if (tensor == NULL) goto forget;
    PyObject *record = new_record(self, Py_NewRef(op_type), Py_NewRef(empty_string), Py_NewRef(names),
                                  list_of_one(((TensorObject *)tensor)->name), Py_NewRef(attributes),
                                  list_of_one(vtype), Py_NewRef(entries),
                                  PyTuple_Pack(4, empty_string, op_type, attributes_id, entries), Py_NewRef(preds));
    if (record == NULL || PyList_Append(self->records, record) < 0) {
        Py_XDECREF(record);
        Py_DECREF(tensor);
        goto forget;
    }
    Py_DECREF(record);
    result = tensor;
    goto done;
forget:  /* no record: the call is not one to reuse (as in Python, where it is known only once recorded) */
    if (at != NULL) {
        PyObject *type, *value, *traceback;
        PyErr_Fetch(&type, &value, &traceback);
        if (PyDict_DelItem(self->calls, seen) < 0) PyErr_Clear();
        PyErr_Restore(type, value, traceback);
    }
done:
    Py_XDECREF(preds);
    Py_XDECREF(names);
    Py_XDECREF(entries);
    Py_XDECREF(vtype);
    Py_XDECREF(seen);
    Py_XDECREF(attributes_id);
    Py_XDECREF(at);
    return result;
}

static PyObject *attributes_or_none(PyObject *attrs) {
    if (attrs == Py_None) return no_attributes;
    int truth = PyObject_IsTrue(attrs);
    return truth < 0 ? NULL : truth ? attrs : no_attributes;
}

/* The ``attrs`` of ``(op_type, inputs, shape(s), dtype(s), attrs=None)`` given positionally or by
   keyword (borrowed; Py_None when not given), or NULL (no error set) for any other arguments. */
static PyObject *attrs_argument(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs < 4 || nargs + keywords > 5) return NULL;
    if (keywords == 0) return nargs == 5 ? args[4] : Py_None;
    return PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(kwnames, 0), "attrs") == 0 ? args[nargs] : NULL;
}

/* What record_one and record_outputs begin with: their arguments checked (``usage`` in the
   TypeError otherwise), the recorder ready, and the record's attributes (borrowed), or NULL. */
static PyObject *record_attributes(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                                   const char *usage) {
    PyObject *attrs = attrs_argument(args, nargs, kwnames);
    if (attrs == NULL) {
        PyErr_SetString(PyExc_TypeError, usage);
        return NULL;
    }
    return recorder_ready(self) ? attributes_or_none(attrs) : NULL;
}

/* Tracer.record_one(op_type, inputs, shape, dtype, attrs=None) */
static PyObject *recorder_record_one(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
    PyObject *attributes = record_attributes(self, args, nargs, kwnames, "record_one(op_type, inputs, shape, dtype, attrs=None)");
    if (attributes == NULL) return NULL;
    return do_record_one(self, args[0], args[1], args[2], args[3], attributes, NULL);
}

/* Tracer._append(op_type, domain, preds, names, attributes, shapes, dtypes, types, entries, key, seen):
   an op of any kind; its outputs as a list of new tensors. */
static PyObject *do_append(RecorderObject *self, PyObject *op_type, PyObject *domain, PyObject *preds,
                           PyObject *names, PyObject *attributes, PyObject *shapes, PyObject *dtypes,
                           PyObject *types, PyObject *entries, PyObject *key, PyObject *seen) {
    PyObject *shape_seq = PySequence_Fast(shapes, "shapes must be a sequence");
    PyObject *dtype_seq = shape_seq == NULL ? NULL : PySequence_Fast(dtypes, "dtypes must be a sequence");
    PyObject *type_seq = dtype_seq == NULL ? NULL : PySequence_Fast(types, "types must be a sequence");
    PyObject *tensors = NULL, *outputs = NULL, *result = NULL;
    if (type_seq == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(shape_seq), k;
    if (PySequence_Fast_GET_SIZE(dtype_seq) < n) n = PySequence_Fast_GET_SIZE(dtype_seq);
    if (PySequence_Fast_GET_SIZE(type_seq) < n) n = PySequence_Fast_GET_SIZE(type_seq);  /* zip() */
    Py_ssize_t index = PyList_GET_SIZE(self->records);
    tensors = PyList_New(n);
    outputs = PyList_New(n);
    if (tensors == NULL || outputs == NULL) goto done;
    for (k = 0; k < n; k++) {
        PyObject *tensor = new_output(self, PySequence_Fast_GET_ITEM(shape_seq, k),
                                      PySequence_Fast_GET_ITEM(dtype_seq, k), PySequence_Fast_GET_ITEM(type_seq, k),
                                      index);
        if (tensor == NULL) goto done;
        PyList_SET_ITEM(outputs, k, Py_NewRef(((TensorObject *)tensor)->name));
        PyList_SET_ITEM(tensors, k, tensor);
    }
    PyObject *record = new_record(self, Py_NewRef(op_type), Py_NewRef(domain), Py_NewRef(names),
                                  Py_NewRef(outputs), Py_NewRef(attributes), Py_NewRef(types), Py_NewRef(entries),
                                  Py_NewRef(key), Py_NewRef(preds));
    if (record == NULL || PyList_Append(self->records, record) < 0) {
        Py_XDECREF(record);
        goto done;
    }
    Py_DECREF(record);
    if (seen != Py_None) {  /* known to reuse_calls once recorded */
        PyObject *at = index_int(index);
        int failed = at == NULL || PyDict_SetItem(self->calls, seen, at) < 0;
        Py_XDECREF(at);
        if (failed) goto done;
    }
    result = Py_NewRef(tensors);
done:
    Py_XDECREF(shape_seq);
    Py_XDECREF(dtype_seq);
    Py_XDECREF(type_seq);
    Py_XDECREF(tensors);
    Py_XDECREF(outputs);
    return result;
}

static PyObject *recorder_outputs_again(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "_outputs_again(seen, shapes, dtypes, types)");
        return NULL;
    }
    if (!recorder_ready(self)) return NULL;
    return do_outputs_again(self, args[0], args[1], args[2], args[3]);
}

static PyObject *recorder_append(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "_append(op_type, domain, preds, names, attributes, shapes, dtypes, types, "
                                         "entries, key, seen)");
        return NULL;
    }
    if (!recorder_ready(self)) return NULL;
    return do_append(self, args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9],
                     args[10]);
}

/* A call seen before (``seen`` in the tracer's calls): its outputs again; else the op appended.
   ``seen``: the call as ``reuse_calls`` knows it, NULL where it is not reused. */
static PyObject *again_or_append(RecorderObject *self, PyObject *op_type, PyObject *domain, PyObject *preds,
                                 PyObject *names, PyObject *attributes, PyObject *shapes, PyObject *dtypes,
                                 PyObject *types, PyObject *entries, PyObject *key, PyObject *seen) {
    if (seen != NULL) {
        int known = PyDict_Contains(self->calls, seen);
        if (known < 0) return NULL;
        if (known) return do_outputs_again(self, seen, shapes, dtypes, types);
    }
    return do_append(self, op_type, domain, preds, names, attributes, shapes, dtypes, types, entries, key,
                     seen != NULL ? seen : Py_None);
}

/* Tracer.record_call(call, inputs): a call whose signature was worked out once (PreparedCall). */
static PyObject *do_record_call(RecorderObject *self, PyObject *call, PyObject *inputs) {
    PyObject *names = NULL, *seen = NULL, *result = NULL;
    PyObject *fields[8] = {NULL};  /* repeatable, shapes, dtypes, types, shared, op_type, domain, entries */
    PyObject *field_names[8] = {str_repeatable, str_shapes, str_dtypes, str_types, str_shared, str_op_type,
                                str_domain, str_entries};
    PyObject *preds = PyList_New(0);
    int k;
    if (preds == NULL) return NULL;
    for (k = 0; k < 8; k++)
        if ((fields[k] = PyObject_GetAttr(call, field_names[k])) == NULL) goto done;
    if (read_operands(self, inputs, &names, preds, NULL) < 0) goto done;
    int repeatable = PyObject_IsTrue(fields[0]);
    if (repeatable < 0) goto done;
    if (repeatable && self->reuse_calls && (seen = seen_key(&call, 1, names)) == NULL) goto done;
    PyObject *extended = PySequence_InPlaceConcat(names, fields[4]);  /* the record's inputs: += call.shared */
    if (extended == NULL) goto done;
    Py_DECREF(extended);
    result = again_or_append(self, fields[5], fields[6], preds, names, no_attributes, fields[1], fields[2], fields[3],
                             fields[7], call, seen);
done:
    for (k = 0; k < 8; k++) Py_XDECREF(fields[k]);
    Py_XDECREF(preds);
    Py_XDECREF(names);
    Py_XDECREF(seen);
    return result;
}

static PyObject *recorder_record_call(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "record_call(call, inputs)");
        return NULL;
    }
    if (!recorder_ready(self)) return NULL;
    return do_record_call(self, args[0], args[1]);
}

/* ``record_outputs`` of shapes and dtypes given as tuples (new references taken) and their types
   (a new reference to a list, each ``tensor_type(dtype, shape)``). */
static PyObject *record_typed_outputs(RecorderObject *self, PyObject *op_type, PyObject *inputs, PyObject *shapes,
                                      PyObject *dtypes, PyObject *types, PyObject *attributes);

/* Tracer.record_outputs(op_type, inputs, shapes, dtypes, attrs=None): ``record_one`` of an op
   with any number of outputs; a list of them. */
static PyObject *recorder_record_outputs(RecorderObject *self, PyObject *const *args, Py_ssize_t nargs,
                                         PyObject *kwnames) {
    PyObject *attributes = record_attributes(self, args, nargs, kwnames,
                                             "record_outputs(op_type, inputs, shapes, dtypes, attrs=None)");
    if (attributes == NULL) return NULL;
    PyObject *shapes = PySequence_Tuple(args[2]), *dtypes = shapes == NULL ? NULL : PySequence_Tuple(args[3]);
    PyObject *types = NULL;
    if (dtypes == NULL) goto error;
    Py_ssize_t n = PyTuple_GET_SIZE(shapes) < PyTuple_GET_SIZE(dtypes) ? PyTuple_GET_SIZE(shapes)
                                                                       : PyTuple_GET_SIZE(dtypes), k;
    types = PyList_New(n);
    if (types == NULL) goto error;
    for (k = 0; k < n; k++) {
        PyObject *type_args[] = {PyTuple_GET_ITEM(dtypes, k), PyTuple_GET_ITEM(shapes, k)};
        PyObject *vtype = PyObject_Vectorcall(tensor_type, type_args, 2, NULL);
        if (vtype == NULL) goto error;
        PyList_SET_ITEM(types, k, vtype);
    }
    return record_typed_outputs(self, args[0], args[1], shapes, dtypes, types, attributes);
error:
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(types);
    return NULL;
}

/* An op of ``count`` outputs of one shape and dtype (a Split into equal parts): their type made once. */
static PyObject *do_record_outputs(RecorderObject *self, PyObject *op_type, PyObject *inputs, PyObject *shape,
                                   PyObject *dtype, Py_ssize_t count, PyObject *attributes) {
    PyObject *type_args[] = {dtype, shape};
    PyObject *vtype = PyObject_Vectorcall(tensor_type, type_args, 2, NULL);
    PyObject *shapes = PyTuple_New(count), *dtypes = PyTuple_New(count), *types = PyList_New(count);
    if (vtype == NULL || shapes == NULL || dtypes == NULL || types == NULL) {
        Py_XDECREF(vtype);
        Py_XDECREF(shapes);
        Py_XDECREF(dtypes);
        Py_XDECREF(types);
        return NULL;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        PyTuple_SET_ITEM(shapes, k, Py_NewRef(shape));
        PyTuple_SET_ITEM(dtypes, k, Py_NewRef(dtype));
        PyList_SET_ITEM(types, k, Py_NewRef(vtype));
    }
    Py_DECREF(vtype);
    return record_typed_outputs(self, op_type, inputs, shapes, dtypes, types, attributes);
}

static PyObject *record_typed_outputs(RecorderObject *self, PyObject *op_type, PyObject *inputs, PyObject *shapes,
                                      PyObject *dtypes, PyObject *types, PyObject *attributes) {
    PyObject *names = NULL, *entries = NULL, *seen = NULL, *key = NULL;
    PyObject *preds = PyList_New(0), *attributes_id = attributes_id_of(attributes), *result = NULL;
    if (preds == NULL || attributes_id == NULL) goto done;
    if (read_operands(self, inputs, &names, preds, &entries) < 0) goto done;
    PyObject *head[] = {op_type, empty_string, attributes_id};
    if (self->reuse_calls && (seen = seen_key(head, 3, names)) == NULL) goto done;
    key = PyTuple_Pack(4, empty_string, op_type, attributes_id, entries);
    if (key != NULL)
        result = again_or_append(self, op_type, empty_string, preds, names, attributes, shapes, dtypes, types, entries,
                                 key, seen);
done:
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(preds);
    Py_XDECREF(attributes_id);
    Py_XDECREF(names);
    Py_XDECREF(entries);
    Py_XDECREF(types);
    Py_XDECREF(seen);
    Py_XDECREF(key);
    return result;
}

/* Tracer.waiting(): the pending tensors still held whose values are not known yet (a weak
   reference a traced output, so a scan of all of them: tens of thousands a primitive minibatch). */
static PyObject *recorder_waiting(RecorderObject *self, PyObject *unused) {
    PyObject *pending = self->pending, *wanted = PyList_New(0);
    if (wanted == NULL) return NULL;
    if (!PyList_Check(pending)) {
        Py_DECREF(wanted);
        PyErr_SetString(PyExc_TypeError, "waiting: _pending must be a list");
        return NULL;
    }
    Py_INCREF(pending);  /* a callback of a dead reference could rebind it meanwhile */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(pending); i++) {
        PyObject *ref = PyList_GET_ITEM(pending, i), *tensor;
        if (!PyWeakref_Check(ref)) {
            PyErr_SetString(PyExc_TypeError, "waiting: _pending holds weak references only");
            goto fail;
        }
        tensor = PyWeakref_GetObject(ref);  /* borrowed; None once the tensor is gone */
        if (tensor == Py_None) continue;
        if (!PyObject_TypeCheck(tensor, &TensorBaseType)) {
            PyErr_SetString(PyExc_TypeError, "waiting: _pending refers to tensors only");
            goto fail;
        }
        Py_INCREF(tensor);  /* held while appended: an allocation may run a collection */
        int failed = ((TensorObject *)tensor)->value == Py_None && PyList_Append(wanted, tensor) < 0;
        Py_DECREF(tensor);
        if (failed) goto fail;
    }
    Py_DECREF(pending);
    return wanted;
fail:
    Py_DECREF(pending);
    Py_DECREF(wanted);
    return NULL;
}

static PyMethodDef recorder_methods[] = {
    {"record_one", (PyCFunction)(void (*)(void))recorder_record_one, METH_FASTCALL | METH_KEYWORDS,
     "record_one(op_type, inputs, shape, dtype, attrs=None): the common op's record; its output tensor."},
    {"record_call", (PyCFunction)(void (*)(void))recorder_record_call, METH_FASTCALL,
     "record_call(call, inputs): a call whose signature was worked out once; its output tensors."},
    {"record_outputs", (PyCFunction)(void (*)(void))recorder_record_outputs, METH_FASTCALL | METH_KEYWORDS,
     "record_outputs(op_type, inputs, shapes, dtypes, attrs=None): record_one of an op of several outputs."},
    {"_outputs_again", (PyCFunction)(void (*)(void))recorder_outputs_again, METH_FASTCALL,
     "_outputs_again(seen, shapes, dtypes, types): new tensors for the outputs of a pending call seen before."},
    {"_append", (PyCFunction)(void (*)(void))recorder_append, METH_FASTCALL,
     "_append(op_type, domain, preds, names, attributes, shapes, dtypes, types, entries, key, seen)."},
    {"waiting", (PyCFunction)recorder_waiting, METH_NOARGS,
     "waiting(): the pending tensors still held whose values are not known yet, in tracing order."},
    {NULL},
};

static PyMemberDef recorder_members[] = {
    {"_records", T_OBJECT_EX, offsetof(RecorderObject, records), 0, NULL},
    {"_pending", T_OBJECT_EX, offsetof(RecorderObject, pending), 0, NULL},
    {"_literals", T_OBJECT_EX, offsetof(RecorderObject, literals), 0, NULL},
    {"_calls", T_OBJECT_EX, offsetof(RecorderObject, calls), 0, NULL},
    {"_names", T_OBJECT_EX, offsetof(RecorderObject, names), 0, NULL},
    {"_instance", T_PYSSIZET, offsetof(RecorderObject, instance), 0, NULL},
    {"reuse_calls", T_BOOL, offsetof(RecorderObject, reuse_calls), 0, NULL},
    {"reused_calls", T_PYSSIZET, offsetof(RecorderObject, reused_calls), 0, NULL},
    {NULL},
};

static PyTypeObject RecorderBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autobatch.frontends._recorder.RecorderBase",
    .tp_basicsize = sizeof(RecorderObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "What a Tracer records into, and its hot paths (frontends.recorder.PyRecorderBase in Python).",
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ operands of ops */
/* ``batch.parameter(p)``: its tensor in this batch (new reference), looked up in the batch's
   memo (``Tracer._parameters``, by the parameter's id) and made by the Python the first time. */
static PyObject *parameter_tensor(PyObject *batch, PyObject *parameter) {
    PyObject *memo = PyObject_GetAttr(batch, str_parameters);
    if (memo != NULL && PyDict_Check(memo)) {
        PyObject *id = PyLong_FromVoidPtr(parameter);
        PyObject *known = id == NULL ? NULL : PyDict_GetItemWithError(memo, id);  /* borrowed */
        Py_XDECREF(id);
        if (known != NULL) {
            Py_INCREF(known);
            Py_DECREF(memo);
            return known;
        }
    }
    Py_XDECREF(memo);
    if (PyErr_Occurred()) return NULL;
    return PyObject_CallMethodOneArg(batch, str_parameter, parameter);
}

/* ``ops._tensors``' common case: every value a Tensor of one batch (or a Parameter, read as that
   batch's tensor) and of one dtype, and that batch the one traced into (or none is). A new list
   of them; NULL with no error set when they are not that case; NULL with an error on failure. */
static PyObject *common_operands(PyObject *const *values, Py_ssize_t n) {
    if (n < 1 || Py_TYPE(values[0]) != (PyTypeObject *)tensor_class) return NULL;
    TensorObject *first = (TensorObject *)values[0];
    if (first->batch == NULL || first->dtype == NULL || !PyObject_TypeCheck(first->batch, &RecorderBaseType))
        return NULL;
    /* held while Python code (``parameter``, a dtype's __eq__) runs */
    PyObject *batch = Py_NewRef(first->batch), *dtype = Py_NewRef(first->dtype), *active = NULL;
    PyObject *list = PyList_New(n);
    int ours = 0;
    Py_ssize_t k;
    if (list == NULL) goto error;
    for (k = 0; k < n; k++) {
        PyObject *value = values[k];
        if (Py_TYPE(value) == (PyTypeObject *)parameter_class) {
            value = parameter_tensor(batch, value);
            if (value == NULL) goto error;
        } else {
            Py_INCREF(value);
        }
        PyList_SET_ITEM(list, k, value);
        if (Py_TYPE(value) != (PyTypeObject *)tensor_class || ((TensorObject *)value)->batch != batch) goto other;
        PyObject *its = ((TensorObject *)value)->dtype;
        int same = its == dtype ? 1 : its == NULL ? 0 : PyObject_RichCompareBool(its, dtype, Py_EQ);
        if (same < 0) goto error;
        if (!same) goto other;
    }
    if (PyContextVar_Get(current_batch_var, NULL, &active) < 0) goto error;
    /* and the first value's batch and dtype still the ones checked: the Python code above may have
       rebound them, and callers read them off it */
    ours = (active == NULL || active == batch) && first->batch == batch && first->dtype == dtype;
    Py_XDECREF(active);
other:
    if (!ours) Py_CLEAR(list);
    Py_DECREF(batch);
    Py_DECREF(dtype);
    return list;
error:
    Py_XDECREF(list);
    Py_DECREF(batch);
    Py_DECREF(dtype);
    return NULL;
}

static int ops_configured(void) {
    if (elementwise_python != NULL && tensors_python != NULL && pick_python != NULL && lookup_python != NULL
        && matmul_python != NULL && split_python != NULL && split_attributes != NULL && gather_attributes != NULL
        && int64_type != NULL && concat_python != NULL && axis_attributes != NULL && recurrent_python != NULL
        && recurrent_layers != NULL && flatten_attributes != NULL && configured())
        return 1;
    PyErr_SetString(PyExc_RuntimeError,
                    "autobatch.frontends._recorder used before configure_ops() and configure_recurrent()");
    return 0;
}

/* folds.fold_children(matrix): a tree's children (``[n, 2]`` int64, C order) checked once a traced
   tree: (the first node whose children are neither LEAF (-1) twice nor two indices of earlier
   nodes, -1 where none; the number of leaves before it). */
static PyObject *fold_children(PyObject *module, PyObject *matrix) {
    Py_buffer view;
    if (PyObject_GetBuffer(matrix, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    if (view.ndim != 2 || view.shape[1] != 2 || view.itemsize != 8 || view.format == NULL ||
        (strcmp(view.format, "l") != 0 && strcmp(view.format, "q") != 0)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "fold_children: the children must be a C-ordered int64 array [n, 2]");
        return NULL;
    }
    const long long *pairs = (const long long *)view.buf;
    Py_ssize_t nodes = view.shape[0], first_bad = -1, leaves = 0;
    for (Py_ssize_t k = 0; k < nodes; k++) {
        long long left = pairs[2 * k], right = pairs[2 * k + 1];
        if (left == -1 && right == -1)
            leaves++;
        else if (left < 0 || right < 0 || left >= k || right >= k) {
            first_bad = k;
            break;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("nn", first_bad, leaves);
}

/* ops._tensors(op_type, *values): operands as tensors of one batch (the Python function beyond
   the common case). */
static PyObject *operands(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    PyObject *list = nargs < 1 ? NULL : common_operands(args + 1, nargs - 1);
    if (list != NULL || PyErr_Occurred()) return list;
    return PyObject_Vectorcall(tensors_python, args, nargs, NULL);
}

/* ops._elementwise(op_type, *values): the common case of ``operands``, all of one shape (the
   Python function, which broadcasts, beyond it). */
static PyObject *elementwise(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    PyObject *inputs = nargs < 1 ? NULL : common_operands(args + 1, nargs - 1);
    if (inputs == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(elementwise_python, args, nargs, NULL);
    }
    Py_ssize_t n = PyList_GET_SIZE(inputs), k;
    TensorObject *first = (TensorObject *)PyList_GET_ITEM(inputs, 0);  /* held by the list */
    if (first->shape == NULL) {
        Py_DECREF(inputs);
        return PyObject_Vectorcall(elementwise_python, args, nargs, NULL);
    }
    PyObject *batch = Py_NewRef(first->batch), *shape = Py_NewRef(first->shape), *dtype = Py_NewRef(first->dtype);
    PyObject *result = NULL, *vtype = NULL;
    int same = 1;
    for (k = 1; k < n && same > 0; k++) {
        PyObject *its = ((TensorObject *)PyList_GET_ITEM(inputs, k))->shape;
        same = its == shape ? 1 : its == NULL ? 0 : PyObject_RichCompareBool(its, shape, Py_EQ);
    }
    /* The result's type is that of an operand which is no shared value (whose entry is its
       name): each operand is of this shape and dtype, and its entry its type. Asking the
       type cache hashed the dtype and the shape for every op. */
    for (k = 0; k < n && vtype == NULL; k++) {
        PyObject *entry = ((TensorObject *)PyList_GET_ITEM(inputs, k))->entry;
        if (entry != NULL && Py_TYPE(entry) == (PyTypeObject *)value_type_class) vtype = entry;
    }
    if (same > 0 && recorder_ready((RecorderObject *)batch))
        result = do_record_one((RecorderObject *)batch, args[0], inputs, shape, dtype, no_attributes, vtype);
    Py_DECREF(inputs);
    Py_DECREF(batch);
    Py_DECREF(shape);
    Py_DECREF(dtype);
    if (same == 0) return PyObject_Vectorcall(elementwise_python, args, nargs, NULL);
    return result;
}

/* ``ops.pick`` and ``ops.lookup`` of a parameter's row by a Python int, where the batch traced
   into has that row already (``Tracer.row`` memoises it: a lookup seen before in this batch). A
   new reference to its tensor; NULL with no error set where it is not that case. */
static PyObject *known_row(PyObject *x, PyObject *i) {
    PyObject *batch = NULL, *rows = NULL, *in_body = NULL, *key = NULL, *row = NULL;
    if (Py_TYPE(x) != (PyTypeObject *)parameter_class || !PyLong_CheckExact(i)) return NULL;
    if (PyContextVar_Get(current_batch_var, NULL, &batch) < 0 || batch == NULL) return NULL;
    if (!PyObject_TypeCheck(batch, &RecorderBaseType)) goto done;
    in_body = PyObject_GetAttr(batch, str_in_cell_body);  /* a cell's body reads the parameter */
    if (in_body == NULL || in_body != Py_False) goto done;
    rows = PyObject_GetAttr(batch, str_rows);
    if (rows == NULL || !PyDict_Check(rows)) goto done;
    PyObject *id = PyLong_FromVoidPtr(x);
    key = id == NULL ? NULL : PyTuple_Pack(2, id, i);  /* Tracer.row's key */
    Py_XDECREF(id);
    if (key == NULL) goto done;
    PyObject *known = PyDict_GetItemWithError(rows, key);  /* (the parameter, its row's tensor) */
    if (known != NULL && PyTuple_Check(known) && PyTuple_GET_SIZE(known) == 2)
        row = Py_NewRef(PyTuple_GET_ITEM(known, 1));
done:
    Py_DECREF(batch);
    Py_XDECREF(in_body);
    Py_XDECREF(rows);
    Py_XDECREF(key);
    return row;
}

/* ``known_row``, else ``python(*args)``. */
static PyObject *row_else(PyObject *python, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    PyObject *row = nargs == 2 ? known_row(args[0], args[1]) : NULL;
    if (row != NULL || PyErr_Occurred()) return row;
    return PyObject_Vectorcall(python, args, nargs, NULL);
}

/* ``ops.pick`` of a traced tensor's element or row by a Python int in range: a Gather of the
   batch's int64 scalar literal (``Tracer.constant``'s, made by it the first time). A new
   reference; NULL with no error set where it is not that case (the Python then: its errors). */
static PyObject *tensor_pick(PyObject *x, PyObject *i) {
    if (Py_TYPE(x) != (PyTypeObject *)tensor_class || !PyLong_CheckExact(i)) return NULL;
    PyObject *inputs = common_operands(&x, 1), *scalars = NULL, *key = NULL, *position = NULL;
    PyObject *row = NULL, *result = NULL, *batch = NULL, *dtype = NULL;
    if (inputs == NULL) return NULL;
    TensorObject *t = (TensorObject *)PyList_GET_ITEM(inputs, 0);
    PyObject *shape = t->shape;
    if (shape == NULL || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) == 0) goto done;
    Py_ssize_t length = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0));
    int overflow = 0;
    long long index = PyLong_AsLongLongAndOverflow(i, &overflow);
    if (PyErr_Occurred()) {  /* (a shape of ints: not expected) */
        PyErr_Clear();
        goto done;
    }
    if (overflow || index < -(long long)length || index >= (long long)length) goto done;  /* the Python's error */
    /* held, and the result's shape made, before Python code (a lookup, ``constant``) runs: it
       may rebind the tensor's fields */
    batch = Py_NewRef(t->batch);
    dtype = Py_NewRef(t->dtype);
    row = PyTuple_GetSlice(shape, 1, PyTuple_GET_SIZE(shape));
    if (row == NULL) goto error;
    scalars = PyObject_GetAttr(batch, str_scalars);
    if (scalars == NULL && PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    if (scalars == NULL || !PyDict_Check(scalars)) goto done;  /* not a Tracer's: the Python's way */
    key = PyTuple_Pack(3, (PyObject *)&PyLong_Type, i, int64_type);  /* constant(i, dtype=np.int64)'s key */
    if (key == NULL) goto error;
    position = PyDict_GetItemWithError(scalars, key);
    if (position != NULL) {
        Py_INCREF(position);
    } else if (PyErr_Occurred()) {
        goto error;
    } else {
        PyObject *call[] = {batch, i, int64_type};
        position = PyObject_VectorcallMethod(str_constant, call, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, dtype_keyword);
        if (position == NULL) goto error;
    }
    if (Py_TYPE(position) != (PyTypeObject *)tensor_class || !recorder_ready((RecorderObject *)batch)) goto error;
    if (PyList_Append(inputs, position) < 0) goto error;
    result = do_record_one((RecorderObject *)batch, str_gather, inputs, row, dtype, gather_attributes, NULL);
    goto done;
error:
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "a pick's position is not a tensor of its batch");
done:
    Py_DECREF(inputs);
    Py_XDECREF(scalars);
    Py_XDECREF(key);
    Py_XDECREF(position);
    Py_XDECREF(row);
    Py_XDECREF(batch);
    Py_XDECREF(dtype);
    return result;
}

static PyObject *pick(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    PyObject *picked = nargs == 2 ? tensor_pick(args[0], args[1]) : NULL;
    if (picked != NULL || PyErr_Occurred()) return picked;
    return row_else(pick_python, args, nargs);
}

/* ``shape`` (a tuple) with dimension ``axis`` made ``size``: a new tuple. */
static PyObject *with_dimension(PyObject *shape, Py_ssize_t axis, Py_ssize_t size) {
    Py_ssize_t rank = PyTuple_GET_SIZE(shape);
    PyObject *made = PyTuple_New(rank);
    if (made == NULL) return NULL;
    for (Py_ssize_t d = 0; d < rank; d++) {
        PyObject *dim = d == axis ? PyLong_FromSsize_t(size) : Py_NewRef(PyTuple_GET_ITEM(shape, d));
        if (dim == NULL) {
            Py_DECREF(made);
            return NULL;
        }
        PyTuple_SET_ITEM(made, d, dim);
    }
    return made;
}

/* ops.concat(xs, axis) of traced tensors of one batch and dtype whose shapes agree but along
   ``axis``: one Concat record; the Python otherwise (its errors, scalars, other batches). */
static PyObject *concat(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    if (nargs != 2 || !PyLong_CheckExact(args[1]) || !(PyList_CheckExact(args[0]) || PyTuple_CheckExact(args[0])))
        return PyObject_Vectorcall(concat_python, args, nargs, NULL);
    PyObject *xs = PySequence_Tuple(args[0]);  /* its own: a list's items could change while Python runs */
    if (xs == NULL) return NULL;
    PyObject *inputs = common_operands(&PyTuple_GET_ITEM(xs, 0), PyTuple_GET_SIZE(xs));
    PyObject *shape = NULL, *attributes = NULL, *axis_object = NULL, *result = NULL;
    Py_DECREF(xs);
    if (inputs == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(concat_python, args, nargs, NULL);
    }
    Py_ssize_t n = PyList_GET_SIZE(inputs), k, d, length = 0;
    TensorObject *first = (TensorObject *)PyList_GET_ITEM(inputs, 0);
    Py_ssize_t axis = PyLong_AsSsize_t(args[1]), rank = first->shape != NULL && PyTuple_CheckExact(first->shape)
                                                            ? PyTuple_GET_SIZE(first->shape) : -1;
    int fits = !PyErr_Occurred() && rank > 0;
    PyErr_Clear();
    if (fits && axis < 0) axis += rank;
    fits = fits && 0 <= axis && axis < rank;
    for (k = 0; k < n && fits; k++) {
        PyObject *its = ((TensorObject *)PyList_GET_ITEM(inputs, k))->shape;
        if (its == NULL || !PyTuple_CheckExact(its) || PyTuple_GET_SIZE(its) != rank) {
            fits = 0;
            break;
        }
        for (d = 0; d < rank && fits; d++) {
            Py_ssize_t dim = PyLong_AsSsize_t(PyTuple_GET_ITEM(its, d));
            if (dim < 0) fits = 0;  /* (an error: cleared below, the Python says what is wrong) */
            else if (d == axis) length += dim;
            else if (dim != PyLong_AsSsize_t(PyTuple_GET_ITEM(first->shape, d))) fits = 0;
        }
    }
    if (!fits) {
        PyErr_Clear();
        Py_DECREF(inputs);
        return PyObject_Vectorcall(concat_python, args, nargs, NULL);
    }
    /* held while Python code (``_axis``, an operand's ``_reads``) runs */
    PyObject *batch = Py_NewRef(first->batch), *dtype = Py_NewRef(first->dtype);
    shape = with_dimension(first->shape, axis, length);
    if (shape == NULL) goto done;
    axis_object = PyLong_FromSsize_t(axis);
    attributes = axis_object == NULL ? NULL : PyObject_Vectorcall(axis_attributes, &axis_object, 1, NULL);
    if (attributes == NULL || !recorder_ready((RecorderObject *)batch)) goto done;
    result = do_record_one((RecorderObject *)batch, str_concat, inputs, shape, dtype, attributes, NULL);
done:
    Py_DECREF(inputs);
    Py_XDECREF(shape);
    Py_XDECREF(axis_object);
    Py_XDECREF(attributes);
    Py_DECREF(batch);
    Py_DECREF(dtype);
    return result;
}

/* ops.split(x, parts, axis) of a traced tensor into equal parts along an axis that holds them:
   one Split record, its outputs alike (one type, made once); the Python otherwise (its errors). */
static PyObject *split(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    if (nargs != 3 || !PyLong_CheckExact(args[1]) || !PyLong_CheckExact(args[2]))
        return PyObject_Vectorcall(split_python, args, nargs, NULL);
    PyObject *inputs = common_operands(args, 1), *part = NULL, *attributes = NULL, *result = NULL;
    if (inputs == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(split_python, args, nargs, NULL);
    }
    TensorObject *t = (TensorObject *)PyList_GET_ITEM(inputs, 0);
    PyObject *shape = t->shape;
    Py_ssize_t parts = PyLong_AsSsize_t(args[1]), axis = PyLong_AsSsize_t(args[2]), rank, extent = -1;
    if (PyErr_Occurred()) PyErr_Clear();  /* (out of range: the Python says so) */
    else if (shape != NULL && PyTuple_CheckExact(shape)) {
        rank = PyTuple_GET_SIZE(shape);
        if (axis < 0) axis += rank;
        if (0 <= axis && axis < rank && parts > 0) {
            extent = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, axis));
            if (extent < 0 || extent % parts) {
                PyErr_Clear();
                extent = -1;
            }
        }
    }
    if (extent < 0) {
        Py_DECREF(inputs);
        return PyObject_Vectorcall(split_python, args, nargs, NULL);
    }
    /* held while Python code (``_split_attributes``, an operand's ``_reads``) runs */
    PyObject *batch = Py_NewRef(t->batch), *dtype = Py_NewRef(t->dtype);
    part = with_dimension(shape, axis, extent / parts);
    if (part == NULL) goto done;
    PyObject *axis_parts[] = {PyLong_FromSsize_t(axis), args[1]};
    if (axis_parts[0] == NULL) goto done;
    attributes = PyObject_Vectorcall(split_attributes, axis_parts, 2, NULL);
    Py_DECREF(axis_parts[0]);
    if (attributes == NULL || !recorder_ready((RecorderObject *)batch)) goto done;
    result = do_record_outputs((RecorderObject *)batch, str_split, inputs, part, dtype, parts, attributes);
done:
    Py_DECREF(inputs);
    Py_XDECREF(part);
    Py_XDECREF(attributes);
    Py_DECREF(batch);
    Py_DECREF(dtype);
    return result;
}

/* ``batch.shared_constant([value])``: found in its memo of short int lists (``Tracer._shared_tensors``,
   keyed as that method keys them), else made by it. */
static PyObject *shared_int(PyObject *batch, PyObject *value) {
    PyObject *memo = PyObject_GetAttr(batch, str_shared_tensors), *key = NULL, *known = NULL;
    if (memo != NULL && PyDict_Check(memo) && (key = PyTuple_Pack(2, int64_type, value)) != NULL)
        known = PyDict_GetItemWithError(memo, key);  /* borrowed */
    Py_XINCREF(known);
    Py_XDECREF(key);
    Py_XDECREF(memo);
    if (known != NULL || PyErr_Occurred()) return known;
    PyObject *list = PyList_New(1);
    if (list == NULL) return NULL;
    PyList_SET_ITEM(list, 0, Py_NewRef(value));
    PyObject *made = PyObject_CallMethodOneArg(batch, str_shared_constant, list);
    Py_DECREF(list);
    return made;
}

/* ops._recurrent(op, x, W, R, B, direction) over ONE sequence ``x [n, d]`` (n > 0) of traced
   tensors (W, R, B: tensors or parameters of x's batch and dtype; B may be None) whose layer was
   checked before (``ops._LAYERS`` holds what the checks found, by the key the Python makes):
   Unsqueeze, the layer, Flatten and Reshape recorded here, as the Python records them; the Python
   otherwise (a layer met first, its errors, other operands). */
static PyObject *recurrent(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    if (nargs != 6) return PyObject_Vectorcall(recurrent_python, args, nargs, NULL);
    int biased = args[4] != Py_None;
    PyObject *inputs = common_operands(args + 1, 3 + biased);
    if (inputs == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(recurrent_python, args, nargs, NULL);
    }
    /* held from here, while Python code (``shared_constant``, an operand's ``_reads``) runs: the
       batch and dtype common_operands checked, the shape as it is now */
    TensorObject *t = (TensorObject *)PyList_GET_ITEM(inputs, 0);
    PyObject *batch = Py_NewRef(t->batch), *dtype = Py_NewRef(t->dtype), *shape = Py_XNewRef(t->shape);
    PyObject *key = NULL, *layer = NULL, *one = NULL, *width = NULL, *constant = NULL, *operands = NULL;
    PyObject *sequence = NULL, *states = NULL, *flat = NULL, *last = NULL, *result = NULL;
    PyObject *shapes = NULL, *dtypes = NULL, *types = NULL, *made = NULL;
    Py_ssize_t n = -1;
    if (shape != NULL && PyTuple_CheckExact(shape) && PyTuple_GET_SIZE(shape) == 2) {
        n = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, 0));
        if (n < 0) PyErr_Clear();
    }
    if (n > 0) {
        PyObject *tail = PyTuple_GetSlice(shape, 1, 2);
        if (tail == NULL) goto done;
        key = PyTuple_New(5 + biased);
        if (key == NULL) {
            Py_DECREF(tail);
            goto done;
        }
        PyTuple_SET_ITEM(key, 0, Py_NewRef(args[0]));
        PyTuple_SET_ITEM(key, 1, Py_NewRef(args[5]));
        PyTuple_SET_ITEM(key, 2, tail);
        for (Py_ssize_t k = 1; k < 3 + biased; k++) {
            PyObject *its = ((TensorObject *)PyList_GET_ITEM(inputs, k))->shape;
            PyTuple_SET_ITEM(key, 2 + k, Py_NewRef(its != NULL ? its : Py_None));
        }
        layer = PyDict_GetItemWithError(recurrent_layers, key);  /* borrowed: held below */
        if (layer == NULL && PyErr_Occurred()) goto done;
        Py_XINCREF(layer);
    }
    Py_ssize_t dirs = -1, hidden = -1, states_width = -1;
    if (layer != NULL && PyTuple_CheckExact(layer) && PyTuple_GET_SIZE(layer) == 3
        && PyDict_CheckExact(PyTuple_GET_ITEM(layer, 2)) && PyDict_GET_SIZE(PyTuple_GET_ITEM(layer, 2))) {
        dirs = PyLong_AsSsize_t(PyTuple_GET_ITEM(layer, 0));
        hidden = dirs < 0 ? -1 : PyLong_AsSsize_t(PyTuple_GET_ITEM(layer, 1));
        if (hidden < 0 || __builtin_mul_overflow(dirs, hidden, &states_width)) states_width = -1;
        PyErr_Clear();
    }
    if (states_width < 0) {  /* a layer not checked yet, or not the common case: the Python's */
        result = PyObject_Vectorcall(recurrent_python, args, nargs, NULL);
        goto done;
    }
    PyObject *attributes = PyTuple_GET_ITEM(layer, 2);
    if (!recorder_ready((RecorderObject *)batch)) goto done;
    PyObject *size = PyTuple_GET_ITEM(shape, 0), *features = PyTuple_GET_ITEM(shape, 1);
    /* x [n, d] -> [n, 1, d]: the layer's one batch */
    one = PyLong_FromLong(1);
    constant = one == NULL ? NULL : shared_int(batch, one);
    operands = constant == NULL ? NULL : PyList_New(2);
    made = operands == NULL ? NULL : PyTuple_Pack(3, size, one, features);
    if (made == NULL) goto done;
    PyList_SET_ITEM(operands, 0, Py_NewRef((PyObject *)t));
    PyList_SET_ITEM(operands, 1, Py_NewRef(constant));
    sequence = do_record_one((RecorderObject *)batch, str_unsqueeze, operands, made, dtype, no_attributes, NULL);
    Py_CLEAR(operands);
    Py_CLEAR(made);
    Py_CLEAR(constant);
    if (sequence == NULL) goto done;
    /* the layer: Y [n, dirs, 1, h] and Y_h [dirs, 1, h] */
    PyObject *dirs_object = PyLong_FromSsize_t(dirs), *hidden_object = PyLong_FromSsize_t(hidden);
    if (dirs_object != NULL && hidden_object != NULL) {
        shapes = PyTuple_New(2);
        if (shapes != NULL) {
            PyTuple_SET_ITEM(shapes, 0, PyTuple_Pack(4, size, dirs_object, one, hidden_object));
            PyTuple_SET_ITEM(shapes, 1, PyTuple_Pack(3, dirs_object, one, hidden_object));
        }
    }
    Py_XDECREF(dirs_object);
    Py_XDECREF(hidden_object);
    if (shapes == NULL || PyTuple_GET_ITEM(shapes, 0) == NULL || PyTuple_GET_ITEM(shapes, 1) == NULL) goto done;
    dtypes = PyTuple_Pack(2, dtype, dtype);
    types = PyList_New(2);
    if (dtypes == NULL || types == NULL) goto done;
    for (Py_ssize_t k = 0; k < 2; k++) {
        PyObject *type_args[] = {dtype, PyTuple_GET_ITEM(shapes, k)};
        PyObject *vtype = PyObject_Vectorcall(tensor_type, type_args, 2, NULL);
        if (vtype == NULL) goto done;
        PyList_SET_ITEM(types, k, vtype);
    }
    operands = PyList_New(3 + biased);
    if (operands == NULL) goto done;
    PyList_SET_ITEM(operands, 0, Py_NewRef(sequence));
    for (Py_ssize_t k = 1; k < 3 + biased; k++) PyList_SET_ITEM(operands, k, Py_NewRef(PyList_GET_ITEM(inputs, k)));
    /* (record_typed_outputs takes shapes, dtypes and types) */
    states = record_typed_outputs((RecorderObject *)batch, args[0], operands, shapes, dtypes, types, attributes);
    shapes = dtypes = types = NULL;
    Py_CLEAR(operands);
    if (states == NULL) goto done;
    if (!PyList_Check(states) || PyList_GET_SIZE(states) != 2) {
        PyErr_SetString(PyExc_RuntimeError, "a recurrent layer's record gave other than two outputs");
        goto done;
    }
    /* Y -> [n, dirs * h]; Y_h -> [dirs * h] */
    width = PyLong_FromSsize_t(states_width);
    operands = width == NULL ? NULL : PyList_New(1);
    made = operands == NULL ? NULL : PyTuple_Pack(2, size, width);
    if (made == NULL) goto done;
    PyList_SET_ITEM(operands, 0, Py_NewRef(PyList_GET_ITEM(states, 0)));
    flat = do_record_one((RecorderObject *)batch, str_flatten, operands, made, dtype, flatten_attributes, NULL);
    Py_CLEAR(operands);
    Py_CLEAR(made);
    constant = flat == NULL ? NULL : shared_int(batch, width);
    operands = constant == NULL ? NULL : PyList_New(2);
    made = operands == NULL ? NULL : PyTuple_Pack(1, width);
    if (made == NULL) goto done;
    PyList_SET_ITEM(operands, 0, Py_NewRef(PyList_GET_ITEM(states, 1)));
    PyList_SET_ITEM(operands, 1, Py_NewRef(constant));
    last = do_record_one((RecorderObject *)batch, str_reshape, operands, made, dtype, no_attributes, NULL);
    if (last != NULL) result = PyTuple_Pack(2, flat, last);
done:
    Py_DECREF(inputs);
    Py_DECREF(batch);
    Py_DECREF(dtype);
    Py_XDECREF(shape);
    Py_XDECREF(key);
    Py_XDECREF(layer);
    Py_XDECREF(one);
    Py_XDECREF(width);
    Py_XDECREF(constant);
    Py_XDECREF(operands);
    Py_XDECREF(made);
    Py_XDECREF(sequence);
    Py_XDECREF(states);
    Py_XDECREF(flat);
    Py_XDECREF(last);
    Py_XDECREF(shapes);
    Py_XDECREF(dtypes);
    Py_XDECREF(types);
    return result;
}

static PyObject *lookup(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    return row_else(lookup_python, args, nargs);
}

/* ops.matmul(a, b) where ``a`` is ``[k]`` or ``[m, k]`` and ``b`` is ``[k, n]`` (operands as
   ``operands`` takes them); the Python function otherwise (batch axes, a mismatch's error). */
static PyObject *matmul(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (!ops_configured()) return NULL;
    PyObject *inputs = nargs == 2 ? common_operands(args, 2) : NULL, *result = NULL;
    if (inputs == NULL) {
        if (PyErr_Occurred()) return NULL;
        return PyObject_Vectorcall(matmul_python, args, nargs, NULL);
    }
    TensorObject *x = (TensorObject *)PyList_GET_ITEM(inputs, 0), *w = (TensorObject *)PyList_GET_ITEM(inputs, 1);
    PyObject *a = x->shape, *b = w->shape, *shape = NULL;
    if (a != NULL && b != NULL && PyTuple_CheckExact(a) && PyTuple_CheckExact(b) && PyTuple_GET_SIZE(b) == 2
        && (PyTuple_GET_SIZE(a) == 1 || PyTuple_GET_SIZE(a) == 2)) {
        Py_ssize_t rank = PyTuple_GET_SIZE(a);
        int fits = PyObject_RichCompareBool(PyTuple_GET_ITEM(a, rank - 1), PyTuple_GET_ITEM(b, 0), Py_EQ);
        if (fits < 0) goto done;
        if (fits) shape = rank == 1 ? PyTuple_Pack(1, PyTuple_GET_ITEM(b, 1))
                                    : PyTuple_Pack(2, PyTuple_GET_ITEM(a, 0), PyTuple_GET_ITEM(b, 1));
        if (fits && shape == NULL) goto done;
    }
    if (shape == NULL) {
        Py_DECREF(inputs);
        return PyObject_Vectorcall(matmul_python, args, nargs, NULL);
    }
    PyObject *batch = Py_NewRef(x->batch), *dtype = Py_NewRef(x->dtype);
    if (recorder_ready((RecorderObject *)batch))
        result = do_record_one((RecorderObject *)batch, str_matmul, inputs, shape, dtype, no_attributes, NULL);
    Py_DECREF(batch);
    Py_DECREF(dtype);
done:
    Py_XDECREF(shape);
    Py_DECREF(inputs);
    return result;
}

/* ------------------------------------------------------------------ cell calls */
/* An operand of a cell call as a tensor of ``batch`` (a new reference): a tensor of it as it
   is, a Python int or bool as ``Tracer.constant`` memoises it (looked up here), a parameter as
   ``Tracer.parameter`` does (likewise), anything else
   through ``batch.as_tensor`` (which raises for a tensor of another batch). */
static PyObject *as_tensor(PyObject *batch, PyObject *scalars, PyObject *value) {
    if (Py_TYPE(value) == (PyTypeObject *)tensor_class && ((TensorObject *)value)->batch == batch)
        return Py_NewRef(value);
    if (scalars != NULL && (PyLong_CheckExact(value) || PyBool_Check(value))) {
        PyObject *key = PyTuple_Pack(3, (PyObject *)Py_TYPE(value), value, Py_None);  /* constant()'s key */
        if (key == NULL) return NULL;
        PyObject *known = PyDict_GetItemWithError(scalars, key);
        Py_DECREF(key);
        if (known != NULL && Py_TYPE(known) == (PyTypeObject *)tensor_class) return Py_NewRef(known);
        if (PyErr_Occurred()) return NULL;
    }
    if (Py_TYPE(value) == (PyTypeObject *)parameter_class) return parameter_tensor(batch, value);
    return PyObject_CallMethodOneArg(batch, str_as_tensor, value);
}

/* ``cells.Cell.__call__``, whose Python is ``Cell._traced_call``: a call records one node of
   the batch its tensors belong to (or of the batch traced into, where none is a tensor); a call
   with keywords, or a tensor whose batch is not the one traced into, runs the Python. */
static PyObject *cell_call(PyObject *self, PyObject *args, PyObject *kwargs) {
    Py_ssize_t n = PyTuple_GET_SIZE(args), k;
    PyObject *batch = NULL, *active = NULL, *key = NULL, *calls = NULL, *result = NULL, *outputs = NULL;
    PyObject *tensors = NULL, *scalars = NULL;
    if (!ops_configured()) return NULL;
    int common = n > 0 && (kwargs == NULL || PyDict_GET_SIZE(kwargs) == 0);
    for (k = 0; k < n && common; k++) {  /* tensors.batch_of: the first tensor's batch */
        PyObject *value = PyTuple_GET_ITEM(args, k);
        if (Py_TYPE(value) == (PyTypeObject *)tensor_class) {
            if (batch == NULL) batch = ((TensorObject *)value)->batch;
        } else {
            common = !PyObject_TypeCheck(value, &TensorBaseType);  /* a subclass of Tensor: the Python */
        }
    }
    if (common) {
        if (PyContextVar_Get(current_batch_var, NULL, &active) < 0) return NULL;
        if (batch == NULL) batch = active;  /* none is a tensor: the batch traced into */
        common = batch != NULL && (active == NULL || active == batch) && PyObject_TypeCheck(batch, &RecorderBaseType);
        if (common) Py_INCREF(batch);  /* held while Python code (``as_tensor``, ``_prepare``) runs */
        Py_XDECREF(active);
    }
    if (!common) {
        PyObject *method = PyObject_GetAttr(self, str_traced_call);
        if (method == NULL) return NULL;
        result = PyObject_Call(method, args, kwargs);
        Py_DECREF(method);
        return result;
    }
    tensors = PyTuple_New(n);
    if (tensors == NULL) goto done;
    for (k = 0; k < n; k++) {
        PyObject *value = PyTuple_GET_ITEM(args, k), *tensor;
        if (Py_TYPE(value) != (PyTypeObject *)tensor_class && scalars == NULL) {
            scalars = PyObject_GetAttr(batch, str_scalars);
            if (scalars == NULL) goto done;
            if (!PyDict_Check(scalars)) Py_CLEAR(scalars);
        }
        tensor = as_tensor(batch, scalars, value);
        if (tensor == NULL) goto done;
        PyTuple_SET_ITEM(tensors, k, tensor);
        if (Py_TYPE(tensor) != (PyTypeObject *)tensor_class || ((TensorObject *)tensor)->entry == NULL) {
            PyErr_SetString(PyExc_TypeError, "Tracer.as_tensor must return a Tensor with its fields set");
            goto done;
        }
    }
    /* Keyed by the entries' ids, which hash in C (a type's hash is Python code): the call
       holds its entries, so no other object takes their ids while it is kept. */
    key = PyTuple_New(n + 1);
    if (key == NULL) goto done;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(self));
    for (k = 0; k < n; k++) {
        PyObject *id = PyLong_FromVoidPtr(((TensorObject *)PyTuple_GET_ITEM(tensors, k))->entry);
        if (id == NULL) goto done;
        PyTuple_SET_ITEM(key, k + 1, id);
    }
    calls = PyObject_GetAttr(batch, str_cell_calls);
    if (calls == NULL) goto done;
    if (!PyDict_Check(calls)) {
        PyErr_SetString(PyExc_TypeError, "Tracer.cell_calls must be a dict");
        goto done;
    }
    PyObject *call = PyDict_GetItemWithError(calls, key);  /* borrowed */
    if (call == NULL) {  /* the first call in this batch with these kinds of operands */
        if (PyErr_Occurred()) goto done;
        PyObject *entries = PyTuple_New(n), *listed = PySequence_List(tensors);
        if (entries != NULL)
            for (k = 0; k < n; k++)
                PyTuple_SET_ITEM(entries, k, Py_NewRef(((TensorObject *)PyTuple_GET_ITEM(tensors, k))->entry));
        PyObject *prepare_args[] = {self, batch, listed, entries};
        PyObject *prepared = entries == NULL || listed == NULL ? NULL
                             : PyObject_VectorcallMethod(str_prepare, prepare_args, 4, NULL);
        Py_XDECREF(entries);
        Py_XDECREF(listed);
        if (prepared == NULL) goto done;
        if (PyDict_SetItem(calls, key, prepared) < 0) {
            Py_DECREF(prepared);
            goto done;
        }
        call = prepared;  /* the reference made here, given up below */
    } else {
        Py_INCREF(call);
    }
    if (recorder_ready((RecorderObject *)batch)) outputs = do_record_call((RecorderObject *)batch, call, tensors);
    Py_DECREF(call);
    if (outputs == NULL) goto done;
    PyObject *returns_tuple = PyObject_GetAttr(self, str_returns_tuple);
    int many = returns_tuple == NULL ? -1 : PyObject_IsTrue(returns_tuple);
    Py_XDECREF(returns_tuple);
    if (many > 0) result = PySequence_Tuple(outputs);
    else if (many == 0) result = PySequence_GetItem(outputs, 0);
done:
    Py_XDECREF(tensors);
    Py_XDECREF(scalars);
    Py_XDECREF(key);
    Py_XDECREF(calls);
    Py_XDECREF(outputs);
    Py_DECREF(batch);
    return result;
}

static PyTypeObject CellBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "autobatch.frontends._recorder.CellBase",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A cell's call in C (frontends.cells.Cell; its Python is Cell._traced_call).",
    .tp_call = cell_call,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ configuration */
static void set_global(PyObject **slot, PyObject *value) {
    Py_XSETREF(*slot, Py_NewRef(value));
}

static PyObject *configure_records(PyObject *module, PyObject *args) {
    PyObject *tensor, *record, *attributes, *types, *value_type;
    if (!PyArg_ParseTuple(args, "O!O!O!OO!:configure_records", &PyType_Type, &tensor, &PyType_Type, &record,
                          &PyDict_Type, &attributes, &types, &PyType_Type, &value_type))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)tensor, &TensorBaseType)
        || ((PyTypeObject *)tensor)->tp_basicsize != TensorBaseType.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "configure_records: the tensor class must subclass TensorBase with "
                                         "__slots__ = ()");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)record, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_records: the record class must be a named tuple");
        return NULL;
    }
    set_global(&tensor_class, tensor);
    set_global(&record_class, record);
    PyObject *id = PyLong_FromVoidPtr(attributes);
    if (id == NULL) return NULL;
    set_global(&no_attributes, attributes);
    Py_XSETREF(no_attributes_id, id);
    set_global(&tensor_type, types);
    set_global(&value_type_class, value_type);
    Py_RETURN_NONE;
}

static PyObject *configure_ops(PyObject *module, PyObject *args) {
    PyObject *parameter, *current, *python, *python_tensors, *python_pick, *python_lookup, *python_matmul;
    PyObject *python_split, *split_attrs, *gather_attrs, *int64, *python_concat, *axis_attrs;
    if (!PyArg_ParseTuple(args, "O!OOOOOOOOO!OOO:configure_ops", &PyType_Type, &parameter, &current, &python,
                          &python_tensors, &python_pick, &python_lookup, &python_matmul, &python_split, &split_attrs,
                          &PyDict_Type, &gather_attrs, &int64, &python_concat, &axis_attrs))
        return NULL;
    if (!PyContextVar_CheckExact(current)) {
        PyErr_SetString(PyExc_TypeError, "configure_ops: the current batch must be a ContextVar");
        return NULL;
    }
    set_global(&parameter_class, parameter);
    set_global(&current_batch_var, current);
    set_global(&elementwise_python, python);
    set_global(&tensors_python, python_tensors);
    set_global(&pick_python, python_pick);
    set_global(&lookup_python, python_lookup);
    set_global(&matmul_python, python_matmul);
    set_global(&split_python, python_split);
    set_global(&split_attributes, split_attrs);
    set_global(&gather_attributes, gather_attrs);
    set_global(&int64_type, int64);
    set_global(&concat_python, python_concat);
    set_global(&axis_attributes, axis_attrs);
    Py_RETURN_NONE;
}

static PyObject *configure_recurrent(PyObject *module, PyObject *args) {
    PyObject *python, *layers, *flatten;
    if (!PyArg_ParseTuple(args, "OO!O!:configure_recurrent", &python, &PyDict_Type, &layers, &PyDict_Type, &flatten))
        return NULL;
    set_global(&recurrent_python, python);
    set_global(&recurrent_layers, layers);
    set_global(&flatten_attributes, flatten);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"configure_recurrent", configure_recurrent, METH_VARARGS,
     "configure_recurrent(python_recurrent, layers, flatten_attributes): what ops' recurrent layers need."},
    {"recurrent", (PyCFunction)(void (*)(void))recurrent, METH_FASTCALL,
     "recurrent(op, x, W, R, B, direction): ops._recurrent's common case in C."},
    {"configure_records", configure_records, METH_VARARGS,
     "configure_records(Tensor, Record, NO_ATTRIBUTES, tensor_type): the classes records are made of."},
    {"configure_ops", configure_ops, METH_VARARGS,
     "configure_ops(Parameter, current_batch_var, python_elementwise, python_tensors, python_pick, python_lookup, "
     "python_matmul, python_split, split_attributes, gather_attributes, int64, python_concat, axis_attributes): "
     "what the ops need."},
    {"concat", (PyCFunction)(void (*)(void))concat, METH_FASTCALL,
     "concat(xs, axis): ops.concat's common case in C."},
    {"split", (PyCFunction)(void (*)(void))split, METH_FASTCALL,
     "split(x, parts, axis): ops.split's common case in C."},
    {"matmul", (PyCFunction)(void (*)(void))matmul, METH_FASTCALL, "matmul(a, b): ops.matmul's common case in C."},
    {"pick", (PyCFunction)(void (*)(void))pick, METH_FASTCALL,
     "pick(x, i): ops.pick's known row of a parameter, and a tensor's element or row by an int, in C."},
    {"lookup", (PyCFunction)(void (*)(void))lookup, METH_FASTCALL,
     "lookup(table, i): ops.lookup's known row of a parameter in C."},
    {"elementwise", (PyCFunction)(void (*)(void))elementwise, METH_FASTCALL,
     "elementwise(op_type, *operands): ops._elementwise's common case in C."},
    {"fold_children", fold_children, METH_O,
     "fold_children(matrix): (the first node of a tree's children [n, 2] int64 that is wrong, -1 where none; leaves)."},
    {"operands", (PyCFunction)(void (*)(void))operands, METH_FASTCALL,
     "operands(op_type, *values): ops._tensors' common case in C."},
    {NULL},
};

static struct PyModuleDef recorder_module = {
    PyModuleDef_HEAD_INIT, "_recorder", "The compiled hot path of tracing (see frontends/recorder.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__recorder(void) {
    memset(index_ints, 0, sizeof index_ints);  /* an embedder's runtime started again: not the old one's ints */
    if (PyType_Ready(&TensorBaseType) < 0 || PyType_Ready(&RecorderBaseType) < 0 || PyType_Ready(&CellBaseType) < 0)
        return NULL;
    empty_string = PyUnicode_InternFromString("");
    empty_tuple = PyTuple_New(0);
    str_reads = PyUnicode_InternFromString("_reads");
    str_parameter = PyUnicode_InternFromString("parameter");
    str_traced_call = PyUnicode_InternFromString("_traced_call");
    str_cell_calls = PyUnicode_InternFromString("cell_calls");
    str_prepare = PyUnicode_InternFromString("_prepare");
    str_returns_tuple = PyUnicode_InternFromString("_returns_tuple");
    str_as_tensor = PyUnicode_InternFromString("as_tensor");
    str_scalars = PyUnicode_InternFromString("_scalars");
    str_in_cell_body = PyUnicode_InternFromString("in_cell_body");
    str_rows = PyUnicode_InternFromString("_rows");
    str_matmul = PyUnicode_InternFromString("MatMul");
    str_parameters = PyUnicode_InternFromString("_parameters");
    str_repeatable = PyUnicode_InternFromString("repeatable");
    str_shapes = PyUnicode_InternFromString("shapes");
    str_dtypes = PyUnicode_InternFromString("dtypes");
    str_types = PyUnicode_InternFromString("types");
    str_shared = PyUnicode_InternFromString("shared");
    str_op_type = PyUnicode_InternFromString("op_type");
    str_domain = PyUnicode_InternFromString("domain");
    str_entries = PyUnicode_InternFromString("entries");
    str_gather = PyUnicode_InternFromString("Gather");
    str_split = PyUnicode_InternFromString("Split");
    str_concat = PyUnicode_InternFromString("Concat");
    str_constant = PyUnicode_InternFromString("constant");
    dtype_keyword = Py_BuildValue("(s)", "dtype");
    str_unsqueeze = PyUnicode_InternFromString("Unsqueeze");
    str_flatten = PyUnicode_InternFromString("Flatten");
    str_reshape = PyUnicode_InternFromString("Reshape");
    str_shared_tensors = PyUnicode_InternFromString("_shared_tensors");
    str_shared_constant = PyUnicode_InternFromString("shared_constant");
    if (!empty_string || !empty_tuple || !str_reads || !str_parameter || !str_repeatable
        || !str_traced_call || !str_cell_calls || !str_prepare || !str_returns_tuple || !str_as_tensor
        || !str_scalars || !str_in_cell_body || !str_rows || !str_matmul || !str_parameters || !str_shapes
        || !str_dtypes || !str_types || !str_shared || !str_op_type || !str_domain
        || !str_entries || !str_gather || !str_split || !str_constant || !str_concat
        || !dtype_keyword || !str_unsqueeze || !str_flatten || !str_reshape || !str_shared_tensors
        || !str_shared_constant)
        return NULL;
    PyObject *module = PyModule_Create(&recorder_module);
    if (module == NULL) return NULL;
    if (PyModule_AddObjectRef(module, "TensorBase", (PyObject *)&TensorBaseType) < 0
        || PyModule_AddObjectRef(module, "RecorderBase", (PyObject *)&RecorderBaseType) < 0
        || PyModule_AddObjectRef(module, "CellBase", (PyObject *)&CellBaseType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
