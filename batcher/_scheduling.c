/* The compiled loops of scheduling (issue 19: planning near Python's floor).

   batcher/schedulers.py and batcher/problem.py hold the same loops in Python, which run where
   this does not build (no compiler) or when AUTOBATCH_PURE_PYTHON is set; tests check that
   both give the same levels and the same schedules (tests/test_scheduling.py).

   depths: problem._depths (each node's topological generation) and the edges' sources at once.
   levels: the DP of problem._levels (per node, the most nodes of its class on a path ending at
   it), in topological order or, for the late levels, backwards.
   search: schedulers._agenda with the level scheduler's choice (schedulers._level_schedule and
   its tie-breaks) or the agenda's own (schedulers.agenda_schedule).
   classes: classing.Classing.sign's loop over the records (classing._classes_of in Python).

   Arrays arrive as C-contiguous NumPy arrays of int64 (float64 for the classes' average
   depths, uint8 for their expense flags); the Python side makes them so. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Py_buffer view;
    Py_ssize_t length;
} Array;

/* A 1-D C-contiguous buffer of `itemsize`-byte items; `kind` names it in errors. */
static int get_array(PyObject *object, Array *array, Py_ssize_t itemsize, const char *kind) {
    if (PyObject_GetBuffer(object, &array->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    if (array->view.itemsize != itemsize || array->view.ndim != 1) {
        PyErr_Format(PyExc_TypeError, "%s: a 1-D array of %zd-byte items expected", kind, itemsize);
        PyBuffer_Release(&array->view);
        return -1;
    }
    array->length = array->view.shape[0];
    return 0;
}

#define INTS(array) ((const int64_t *)(array).view.buf)

/* Whether every entry of `values` lies in [low, high): indices read below must. */
static int in_range(const Array *values, int64_t low, int64_t high, const char *kind) {
    const int64_t *v = INTS(*values);
    for (Py_ssize_t k = 0; k < values->length; k++)
        if (v[k] < low || v[k] >= high) {
            PyErr_Format(PyExc_ValueError, "%s: entry %lld out of range", kind, (long long)v[k]);
            return 0;
        }
    return 1;
}

/* A CSR adjacency (starts[n + 1] ascending from 0 to len(targets), targets in [0, n)). */
static int valid_csr(const Array *starts, const Array *targets, Py_ssize_t n) {
    const int64_t *s = INTS(*starts);
    if (starts->length != n + 1 || s[0] != 0 || s[n] != targets->length) {
        PyErr_SetString(PyExc_ValueError, "adjacency: starts do not match the nodes and targets");
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i + 1] < s[i]) {
            PyErr_SetString(PyExc_ValueError, "adjacency: starts not ascending");
            return 0;
        }
    return in_range(targets, 0, n, "adjacency");
}

/* ------------------------------------------------------------------ depths and edges */
static PyObject *depths(PyObject *self, PyObject *args) {
    PyObject *preds, *depth_o, *sources_o, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &preds, &depth_o, &sources_o)) return NULL;
    Py_buffer depth_view, sources_view;
    if (PyObject_GetBuffer(depth_o, &depth_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    if (PyObject_GetBuffer(sources_o, &sources_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail0;
    PyObject *all = PySequence_Fast(preds, "depths: preds must be a sequence");
    if (all == NULL) goto fail1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(all), total = sources_view.len / 8, e = 0;
    if (depth_view.itemsize != 8 || depth_view.len != n * 8 || sources_view.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "depths: the outputs must be int64s, a node each and an edge each");
        goto done;
    }
    int64_t *depth = (int64_t *)depth_view.buf, *sources = (int64_t *)sources_view.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *read = PySequence_Fast(PySequence_Fast_GET_ITEM(all, i), "depths: a node's preds must be a sequence");
        if (read == NULL) goto done;
        Py_ssize_t count = PySequence_Fast_GET_SIZE(read);
        int64_t deepest = 0;
        for (Py_ssize_t k = 0; k < count; k++) {
            long long p = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(read, k));
            if (p == -1 && PyErr_Occurred()) {
                Py_DECREF(read);
                goto done;
            }
            if (p < 0 || p >= i || e >= total) {  /* nodes come in topological order */
                PyErr_Format(PyExc_ValueError, "depths: node %zd reads %lld, not an earlier node (or more edges "
                             "than counted)", i, p);
                Py_DECREF(read);
                goto done;
            }
            sources[e++] = p;
            if (depth[p] >= deepest) deepest = depth[p] + 1;
        }
        Py_DECREF(read);
        depth[i] = deepest;
    }
    if (e != total) {
        PyErr_SetString(PyExc_ValueError, "depths: fewer edges than counted");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    Py_DECREF(all);
fail1:
    PyBuffer_Release(&sources_view);
fail0:
    PyBuffer_Release(&depth_view);
    return result;
}

/* ------------------------------------------------------------------ live records */
static PyObject *alive(PyObject *self, PyObject *args) {
    PyObject *preds, *producers, *flags_o, *result = NULL;
    if (!PyArg_ParseTuple(args, "OOO", &preds, &producers, &flags_o)) return NULL;
    Py_buffer flags_view;
    if (PyObject_GetBuffer(flags_o, &flags_view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) return NULL;
    PyObject *all = PySequence_Fast(preds, "alive: preds must be a sequence");
    PyObject *wanted = all == NULL ? NULL : PySequence_Fast(producers, "alive: producers must be a sequence");
    if (wanted == NULL) goto done;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(all), count = 0;
    char *flags = (char *)flags_view.buf;
    if (flags_view.itemsize != 1 || flags_view.len != n) {
        PyErr_SetString(PyExc_ValueError, "alive: flags must be bytes, one a node");
        goto done;
    }
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(wanted); k++) {
        long long p = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(wanted, k));
        if (p == -1 && PyErr_Occurred()) goto done;
        if (p < 0 || p >= n) {
            PyErr_Format(PyExc_ValueError, "alive: producer %lld is not a node", p);
            goto done;
        }
        flags[p] = 1;
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {  /* predecessors come first: one backward pass */
        if (!flags[i]) continue;
        count++;
        PyObject *read = PySequence_Fast(PySequence_Fast_GET_ITEM(all, i), "alive: a node's preds must be a sequence");
        if (read == NULL) goto done;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(read); k++) {
            long long p = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(read, k));
            if (p == -1 && PyErr_Occurred()) {
                Py_DECREF(read);
                goto done;
            }
            if (p < 0 || p >= i) {
                PyErr_Format(PyExc_ValueError, "alive: node %zd reads %lld, not an earlier node", i, p);
                Py_DECREF(read);
                goto done;
            }
            flags[p] = 1;
        }
        Py_DECREF(read);
    }
    result = PyLong_FromSsize_t(count);
done:
    Py_XDECREF(wanted);
    Py_XDECREF(all);
    PyBuffer_Release(&flags_view);
    return result;
}

/* ------------------------------------------------------------------ classes of records */
/* A record key's identity: the objects it is made of (a tuple's items, a tuple item's items:
   a traced key is ("", op_type, attributes' id, entries)), an exact int by its value (each
   record has its own int object for the attributes' id). Keys of one identity are equal, so
   they share a class: looked up by pointers and ints, no Python __hash__ or __eq__ called (a
   traced key holds ValueTypes, whose hash is Python code). */
static uint64_t part_of(PyObject *item) {
    if (PyLong_CheckExact(item)) {
        int overflow = 0;
        long long value = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (!overflow && !(value == -1 && PyErr_Occurred())) return (uint64_t)value * 0x9E3779B97F4A7C15ULL;
        PyErr_Clear();
    }
    return (uint64_t)(uintptr_t)item;
}

static uint64_t identity_of(PyObject *key) {
    uint64_t h = 1469598103934665603ULL;
#define MIX(v) (h = (h ^ (v)) * 1099511628211ULL, h ^= h >> 29)
    if (!PyTuple_Check(key)) {
        MIX(part_of(key));
        return h;
    }
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(key); k++) {
        PyObject *item = PyTuple_GET_ITEM(key, k);
        if (PyTuple_Check(item)) {
            MIX((uint64_t)PyTuple_GET_SIZE(item) + 1);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(item); j++) MIX(part_of(PyTuple_GET_ITEM(item, j)));
        } else {
            MIX(part_of(item));
        }
    }
#undef MIX
    return h;
}

/* The same object, or exact ints of one value (compared as such: no Python code runs). */
static int same_part(PyObject *x, PyObject *y) {
    if (x == y) return 1;
    if (!PyLong_CheckExact(x) || !PyLong_CheckExact(y)) return 0;
    int same = PyObject_RichCompareBool(x, y, Py_EQ);
    if (same < 0) PyErr_Clear();
    return same > 0;
}

static int same_identity(PyObject *a, PyObject *b) {
    if (a == b) return 1;
    if (!PyTuple_Check(a) || !PyTuple_Check(b) || PyTuple_GET_SIZE(a) != PyTuple_GET_SIZE(b)) return same_part(a, b);
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(a); k++) {
        PyObject *x = PyTuple_GET_ITEM(a, k), *y = PyTuple_GET_ITEM(b, k);
        if (same_part(x, y)) continue;
        if (!PyTuple_Check(x) || !PyTuple_Check(y) || PyTuple_GET_SIZE(x) != PyTuple_GET_SIZE(y)) return 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(x); j++)
            if (!same_part(PyTuple_GET_ITEM(x, j), PyTuple_GET_ITEM(y, j))) return 0;
    }
    return 1;
}

typedef struct {
    uint64_t hash;
    PyObject *key;  /* borrowed: its record, in the list being read, holds it */
    PyObject *cls;  /* borrowed: class_of holds it */
} KeySlot;

static PyObject *classes(PyObject *self, PyObject *args) {
    PyObject *records_o, *class_of, *make, *out;
    if (!PyArg_ParseTuple(args, "OO!OO!", &records_o, &PyDict_Type, &class_of, &make, &PyList_Type, &out)) return NULL;
    PyObject *records = PySequence_Fast(records_o, "classes: records must be a sequence");
    if (records == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(records), size = 1024, used = 0;
    KeySlot *table = calloc((size_t)size, sizeof(KeySlot));
    PyObject *result = NULL;
    if (table == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *record = PySequence_Fast_GET_ITEM(records, i);
        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) < 8) {
            PyErr_SetString(PyExc_TypeError, "classes: a record must be a Record (a tuple of its fields)");
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(record, 7), *cls = NULL;
        uint64_t hash = identity_of(key);
        Py_ssize_t at = (Py_ssize_t)(hash & (uint64_t)(size - 1));
        while (table[at].key != NULL) {
            if (table[at].hash == hash && same_identity(table[at].key, key)) {
                cls = table[at].cls;
                break;
            }
            at = (at + 1) & (size - 1);
        }
        if (cls == NULL) {  /* a new identity: its class by value, else a new class */
            cls = PyDict_GetItemWithError(class_of, key);
            if (cls == NULL) {
                if (PyErr_Occurred()) goto done;
                PyObject *made = PyObject_CallOneArg(make, record);
                if (made == NULL) goto done;
                int failed = PyDict_SetItem(class_of, key, made);
                Py_DECREF(made);
                if (failed < 0) goto done;
                cls = PyDict_GetItemWithError(class_of, key);  /* borrowed, held by class_of */
                if (cls == NULL) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "classes: a key's class vanished");
                    goto done;
                }
            }
            table[at].hash = hash;
            table[at].key = key;
            table[at].cls = cls;
            if (++used * 2 > size) {  /* grown at half full: probes stay short */
                KeySlot *grown = calloc((size_t)size * 2, sizeof(KeySlot));
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                for (Py_ssize_t k = 0; k < size; k++) {
                    if (table[k].key == NULL) continue;
                    Py_ssize_t to = (Py_ssize_t)(table[k].hash & (uint64_t)(size * 2 - 1));
                    while (grown[to].key != NULL) to = (to + 1) & (size * 2 - 1);
                    grown[to] = table[k];
                }
                free(table);
                table = grown;
                size *= 2;
            }
        }
        if (PyList_Append(out, cls) < 0) goto done;
    }
    result = Py_NewRef(Py_None);
done:
    free(table);
    Py_DECREF(records);
    return result;
}

/* ------------------------------------------------------------------ levels */
static PyObject *levels(PyObject *self, PyObject *args) {
    PyObject *starts_o, *sources_o, *sig_o, *out_o, *result = NULL;
    Py_ssize_t classes;
    int backwards;
    if (!PyArg_ParseTuple(args, "OOOnpO", &starts_o, &sources_o, &sig_o, &classes, &backwards, &out_o))
        return NULL;
    Array starts, sources, sig, out;
    if (get_array(starts_o, &starts, 8, "starts") < 0) return NULL;
    if (get_array(sources_o, &sources, 8, "sources") < 0) goto fail0;
    if (get_array(sig_o, &sig, 8, "sig") < 0) goto fail1;
    if (PyObject_GetBuffer(out_o, &out.view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) goto fail2;
    Py_ssize_t n = sig.length;
    int32_t *best = NULL;
    if (out.view.itemsize != 8 || out.view.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "levels: the output must be n int64s");
        goto done;
    }
    if (classes < 1 || !valid_csr(&starts, &sources, n) || !in_range(&sig, -1, classes, "sig"))
        goto done;
    if ((size_t)n > SIZE_MAX / sizeof(int32_t) / (size_t)classes) {
        PyErr_NoMemory();
        goto done;
    }
    best = calloc((size_t)n * (size_t)classes, sizeof(int32_t));
    if (best == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *s = INTS(starts), *p = INTS(sources), *g = INTS(sig);
    int64_t *level = (int64_t *)out.view.buf;
    for (Py_ssize_t k = 0; k < n; k++) {  /* sources before their readers: forwards, or backwards */
        Py_ssize_t i = backwards ? n - 1 - k : k;
        int32_t *row = best + (size_t)i * (size_t)classes;
        for (int64_t e = s[i]; e < s[i + 1]; e++) {
            const int32_t *above = best + (size_t)p[e] * (size_t)classes;
            for (Py_ssize_t c = 0; c < classes; c++)
                if (above[c] > row[c]) row[c] = above[c];
        }
        level[i] = g[i] >= 0 ? ++row[g[i]] : 0;
    }
    result = Py_NewRef(Py_None);
done:
    free(best);
    PyBuffer_Release(&out.view);
fail2:
    PyBuffer_Release(&sig.view);
fail1:
    PyBuffer_Release(&sources.view);
fail0:
    PyBuffer_Release(&starts.view);
    return result;
}

/* ------------------------------------------------------------------ search */
enum { AGENDA, FEWEST_READY, MOST_LEVELS_AHEAD, AGENDA_RULE };

typedef struct {
    Py_ssize_t n, classes;
    int mode;
    const int64_t *sig, *code;          /* per node: class (-1: unbatchable), (class, level) code */
    const int64_t *code_start, *code_level;  /* per class: its codes' start (levels ascending); per code: level */
    const double *average;
    const uint8_t *expensive;
    int64_t *pending, *ready_at;        /* per code: nodes not launched, ready nodes */
    int64_t *lowest;                    /* per class: its lowest code with nodes pending */
    int64_t *pool, *pool_start, *ready_count;  /* per class: its ready nodes at pool[pool_start[c]:][:count] */
    int64_t *ready_classes, *position;  /* the classes with ready nodes, and where each is in that list */
    Py_ssize_t ready_class_count;
    int64_t *unbatchable;               /* ready unbatchable nodes, first ready first */
    Py_ssize_t unbatchable_head, unbatchable_tail;
} Search;

static void make_ready(Search *s, int64_t i) {
    int64_t c = s->sig[i];
    if (c < 0) {
        s->unbatchable[s->unbatchable_tail++] = i;
        return;
    }
    if (s->ready_count[c] == 0) {
        s->position[c] = s->ready_class_count;
        s->ready_classes[s->ready_class_count++] = c;
    }
    s->pool[s->pool_start[c] + s->ready_count[c]++] = i;
    if (s->mode != AGENDA) s->ready_at[s->code[i]]++;
}

/* Whether class a goes before class b: the level choice prefers a class whose ready nodes are
   all of its lowest pending level's, then the tie-break's key (each ends with the class, as in
   Python, so no two classes tie). */
static int before(const Search *s, int64_t a, int64_t b) {
    if (s->mode != AGENDA) {
        int complete_a = s->ready_at[s->lowest[a]] == s->pending[s->lowest[a]];
        int complete_b = s->ready_at[s->lowest[b]] == s->pending[s->lowest[b]];
        if (complete_a != complete_b) return complete_a;
    }
    if (s->mode == FEWEST_READY && s->ready_count[a] != s->ready_count[b])
        return s->ready_count[a] < s->ready_count[b];
    if (s->mode == MOST_LEVELS_AHEAD) {
        int64_t ahead_a = s->code_level[s->lowest[a]] - s->code_level[s->code_start[a + 1] - 1];
        int64_t ahead_b = s->code_level[s->lowest[b]] - s->code_level[s->code_start[b + 1] - 1];
        return ahead_a != ahead_b ? ahead_a < ahead_b : a < b;
    }
    if (s->average[a] != s->average[b]) return s->average[a] < s->average[b];
    if (s->expensive[a] != s->expensive[b]) return s->expensive[a] < s->expensive[b];
    return a < b;
}

static int compare_nodes(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The chosen class's ready nodes, ascending, taken out of the ready set (and out of its
   levels' pending counts); the class's lowest pending code moved on past finished levels. */
static Py_ssize_t take_class(Search *s, int64_t c, int64_t **group) {
    Py_ssize_t count = s->ready_count[c];
    *group = s->pool + s->pool_start[c];
    qsort(*group, (size_t)count, sizeof(int64_t), compare_nodes);
    s->ready_count[c] = 0;
    int64_t last = s->ready_classes[--s->ready_class_count];
    s->ready_classes[s->position[c]] = last;
    s->position[last] = s->position[c];
    if (s->mode != AGENDA) {
        for (Py_ssize_t k = 0; k < count; k++) {
            int64_t code = s->code[(*group)[k]];
            s->ready_at[code]--;
            s->pending[code]--;
        }
        int64_t end = s->code_start[c + 1];
        while (s->lowest[c] < end - 1 && s->pending[s->lowest[c]] == 0) s->lowest[c]++;
    }
    return count;
}

static PyObject *search(PyObject *self, PyObject *args) {
    PyObject *objects[10];
    int mode;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOin", &objects[0], &objects[1], &objects[2], &objects[3], &objects[4],
                          &objects[5], &objects[6], &objects[7], &objects[8], &objects[9], &mode, &limit))
        return NULL;
    /* sig, starts, readers, waiting, average, expensive, code, code_start, code_level, code_pending */
    static const char *names[10] = {"sig", "starts", "readers", "waiting", "average", "expensive", "code",
                                    "code_start", "code_level", "code_pending"};
    static const Py_ssize_t sizes[10] = {8, 8, 8, 8, 8, 1, 8, 8, 8, 8};
    Array arrays[10];
    int got = 0;
    PyObject *result = NULL;
    int64_t *memory = NULL;
    for (; got < 10; got++)
        if (get_array(objects[got], &arrays[got], sizes[got], names[got]) < 0) goto done;
    if (mode < AGENDA || mode > AGENDA_RULE) {
        PyErr_SetString(PyExc_ValueError, "search: unknown mode");
        goto done;
    }
    Search s = {0};
    s.n = arrays[0].length;
    s.classes = arrays[4].length;
    s.mode = mode;
    s.sig = INTS(arrays[0]);
    s.code = INTS(arrays[6]);
    s.code_start = INTS(arrays[7]);
    s.code_level = INTS(arrays[8]);
    s.average = (const double *)arrays[4].view.buf;
    s.expensive = (const uint8_t *)arrays[5].view.buf;
    Py_ssize_t n = s.n, classes = s.classes, codes = arrays[8].length;
    if (!valid_csr(&arrays[1], &arrays[2], n) || arrays[3].length != n || arrays[5].length != classes ||
        !in_range(&arrays[0], -1, classes, "sig"))
        goto done;
    if (mode != AGENDA) {
        const int64_t *cs = s.code_start;
        if (arrays[6].length != n || arrays[7].length != classes + 1 || arrays[9].length != codes ||
            cs[0] != 0 || cs[classes] != codes) {
            PyErr_SetString(PyExc_ValueError, "search: level codes do not match the nodes and classes");
            goto done;
        }
        for (Py_ssize_t c = 0; c < classes; c++)  /* (a class of no node, run alone, has none) */
            if (cs[c + 1] < cs[c]) {
                PyErr_SetString(PyExc_ValueError, "search: level codes' starts not ascending");
                goto done;
            }
        for (Py_ssize_t i = 0; i < n; i++)
            if (s.sig[i] >= 0 && (s.code[i] < cs[s.sig[i]] || s.code[i] >= cs[s.sig[i] + 1])) {
                PyErr_SetString(PyExc_ValueError, "search: a node's level code is not its class's");
                goto done;
            }
    }
    /* One allocation: pending, ready_at (codes each); lowest, pool_start, ready_count, ready_classes,
       position (classes each, pool_start one more); pool, unbatchable, waiting, launched (n each). */
    size_t words = 2 * (size_t)codes + 5 * (size_t)classes + 1 + 4 * (size_t)n;
    memory = calloc(words ? words : 1, sizeof(int64_t));
    if (memory == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    s.pending = memory;
    s.ready_at = s.pending + codes;
    s.lowest = s.ready_at + codes;
    s.pool_start = s.lowest + classes;
    s.ready_count = s.pool_start + classes + 1;
    s.ready_classes = s.ready_count + classes;
    s.position = s.ready_classes + classes;
    s.pool = s.position + classes;
    s.unbatchable = s.pool + n;
    int64_t *waiting = s.unbatchable + n;
    int64_t *launched = waiting + n;  /* a launch's nodes: its readers may be made ready into its class's pool */
    memcpy(waiting, INTS(arrays[3]), (size_t)n * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++)  /* a class's pool holds at most its nodes */
        if (s.sig[i] >= 0) s.pool_start[s.sig[i] + 1]++;
    for (Py_ssize_t c = 0; c < classes; c++) s.pool_start[c + 1] += s.pool_start[c];
    if (mode != AGENDA) {
        memcpy(s.pending, INTS(arrays[9]), (size_t)codes * sizeof(int64_t));
        for (Py_ssize_t c = 0; c < classes; c++) s.lowest[c] = s.code_start[c];
    }
    const int64_t *starts = INTS(arrays[1]), *readers = INTS(arrays[2]);
    for (Py_ssize_t i = 0; i < n; i++)
        if (waiting[i] == 0) make_ready(&s, i);
    result = PyList_New(0);
    if (result == NULL) goto done;
    Py_ssize_t done_count = 0;
    int64_t single;
    while (done_count < n) {
        if (limit >= 0 && PyList_GET_SIZE(result) >= limit) {
            Py_SETREF(result, Py_NewRef(Py_None));
            goto done;
        }
        int64_t *group;
        Py_ssize_t count;
        if (s.unbatchable_head < s.unbatchable_tail) {
            single = s.unbatchable[s.unbatchable_head++];
            group = &single;
            count = 1;
        } else if (s.ready_class_count > 0) {
            int64_t chosen = s.ready_classes[0];
            for (Py_ssize_t k = 1; k < s.ready_class_count; k++)
                if (before(&s, s.ready_classes[k], chosen)) chosen = s.ready_classes[k];
            count = take_class(&s, chosen, &group);
            memcpy(launched, group, (size_t)count * sizeof(int64_t));
            group = launched;
        } else {
            PyErr_SetString(PyExc_ValueError, "search: nothing ready, and nodes left (a cycle, or waiting counts wrong)");
            Py_CLEAR(result);
            goto done;
        }
        PyObject *launch = PyList_New(count);
        if (launch == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        for (Py_ssize_t k = 0; k < count; k++) {
            PyObject *node = PyLong_FromLongLong(group[k]);
            if (node == NULL) {
                Py_DECREF(launch);
                Py_CLEAR(result);
                goto done;
            }
            PyList_SET_ITEM(launch, k, node);
        }
        int appended = PyList_Append(result, launch);
        Py_DECREF(launch);
        if (appended < 0) {
            Py_CLEAR(result);
            goto done;
        }
        done_count += count;
        for (Py_ssize_t k = 0; k < count; k++) {  /* launched: their readers wait for one fewer */
            int64_t i = group[k];
            for (int64_t e = starts[i]; e < starts[i + 1]; e++)
                if (--waiting[readers[e]] == 0) make_ready(&s, readers[e]);
        }
    }
done:
    free(memory);
    for (int k = 0; k < got; k++) PyBuffer_Release(&arrays[k].view);
    return result;
}

static PyMethodDef module_methods[] = {
    {"depths", depths, METH_VARARGS,
     "depths(preds, depth, sources): problem._depths into depth (int64, a node each) and each node's preds, "
     "one after the other, into sources (int64, an edge each)."},
    {"alive", alive, METH_VARARGS,
     "alive(preds, producers, flags): flat._live's pass, flags (bytes, a node each, zeros) set to 1 for every node "
     "a producer reads, itself included; how many."},
    {"classes", classes, METH_VARARGS,
     "classes(records, class_of, make, out): Classing.sign's loop, each record's class appended to out: "
     "class_of[record.key], or make(record) stored there for a key new to it; keys looked up by the "
     "objects they are made of first."},
    {"levels", levels, METH_VARARGS,
     "levels(starts, sources, sig, classes, backwards, out): problem._levels' DP into out (int64, a node each)."},
    {"search", search, METH_VARARGS,
     "search(sig, starts, readers, waiting, average, expensive, code, code_start, code_level, code_pending, mode, "
     "limit): a schedule (a list of launches), or None at limit launches (limit < 0: none)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef scheduling_module = {
    PyModuleDef_HEAD_INIT, "_scheduling", "The compiled loops of scheduling (see batcher/schedulers.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__scheduling(void) { return PyModule_Create(&scheduling_module); }
