/* Passes over one row of a 152k vocabulary that numpy can only make as several (a mask, a cast, a multiply, a
 * nonzero), each reading the row again. decode/rows.py is the only caller and holds the numpy equivalent that
 * runs where this module was not built; tests/fast/test_rows.py checks the two agree.
 *
 * Top-p's band, in both passes that make it (`split` over given weights, `weights` computing them, _weights.c):
 * w is zeroed below lo (never kept once the cut is in [lo, hi]), sums[b] receives the weight of block b's
 * logits above hi (always kept), ids the logits in [lo, hi], narrowed (`narrow`) to the few ranges of values
 * where the weight from the top reaches top_p of the total: the caller finds the cut among them in exact weights.
 *
 * Arguments are C-contiguous buffers checked by rows.py: row and w float32 [n], ids int64 [n], sums double.
 * Weights are summed in float32 over a block (1024 ids) at a time and the blocks in double (numpy's pairwise sum
 * is as close). x86-64 runs SSE2 versions of the passes, other CPUs the portable C ones; `portable` asks for
 * those. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#if defined(_MSC_VER)
#include <intrin.h> /* _BitScanForward */
#endif
#define SSE2 1 /* every x86-64 CPU has it: one build runs on all of them */
#else
#define SSE2 0
#endif


/* The portable passes: plain C, the reference for the SSE2 ones (tests run both) and what other CPUs run. A mask
 * is applied to a weight's bits, not by a branch or a product: compilers vectorize this form (and only this
 * one, of those tried) at -O2 and -O3. */

static inline float masked(float w, int keep) {
    uint32_t bits;
    memcpy(&bits, &w, sizeof bits);
    bits &= -(uint32_t)keep;
    memcpy(&w, &bits, sizeof w);
    return w;
}

static double split_c(const float *row, float *w, Py_ssize_t n, float lo, float hi, double *sums,
                      Py_ssize_t block) {
    /* sums[b] = block b's weight above hi, w = 0 below lo; returns the whole weight */
    double total = 0.0;
    for (Py_ssize_t i = 0, b = 0; i < n; i += block, b++) {
        float up[8] = {0}, all[8] = {0};
        Py_ssize_t end = i + block < n ? i + block : n, k = i;
        for (; k + 8 <= end; k += 8)
            for (int j = 0; j < 8; j++) {
                up[j] += masked(w[k + j], row[k + j] > hi);
                all[j] += w[k + j];
                w[k + j] = masked(w[k + j], row[k + j] >= lo);
            }
        for (; k < end; k++) {
            up[0] += masked(w[k], row[k] > hi);
            all[0] += w[k];
            w[k] = masked(w[k], row[k] >= lo);
        }
        sums[b] = 0.0;
        for (int j = 0; j < 8; j++) {
            sums[b] += up[j];
            total += all[j];
        }
    }
    return total;
}

static Py_ssize_t ids_between_c(const float *row, Py_ssize_t from, Py_ssize_t n, float lo, float hi,
                                int64_t *ids, Py_ssize_t m) {
    for (Py_ssize_t i = from; i < n; i++) {
        ids[m] = i; /* always stored, kept where the logit is inside: no branch */
        m += (row[i] >= lo) & (row[i] <= hi);
    }
    return m;
}

#if SSE2
static double split_sse2(const float *row, float *w, Py_ssize_t n, float lo, float hi, double *sums,
                         Py_ssize_t block) {
    const __m128 l = _mm_set1_ps(lo), h = _mm_set1_ps(hi);
    double total = 0.0;
    Py_ssize_t i = 0, b = 0;
    for (; i + block <= n; i += block, b++) {
        __m128 up = _mm_setzero_ps(), all = _mm_setzero_ps();
        for (Py_ssize_t k = i; k < i + block; k += 4) {
            __m128 r = _mm_loadu_ps(row + k), x = _mm_loadu_ps(w + k);
            up = _mm_add_ps(up, _mm_and_ps(_mm_cmpgt_ps(r, h), x));
            all = _mm_add_ps(all, x);
            _mm_storeu_ps(w + k, _mm_and_ps(_mm_cmpge_ps(r, l), x));
        }
        float lanes[8];
        _mm_storeu_ps(lanes, up);
        _mm_storeu_ps(lanes + 4, all);
        sums[b] = (double)lanes[0] + lanes[1] + lanes[2] + lanes[3];
        total += (double)lanes[4] + lanes[5] + lanes[6] + lanes[7];
    }
    return total + split_c(row + i, w + i, n - i, lo, hi, sums + b, block);
}

static Py_ssize_t ids_between_sse2(const float *row, Py_ssize_t n, float lo, float hi, int64_t *ids) {
    /* sixteen flags at a time as a bit mask; a band is a few percent of the row, so most masks hold 0-2 ids */
    const __m128 l = _mm_set1_ps(lo), h = _mm_set1_ps(hi);
    Py_ssize_t m = 0, i = 0;
    for (; i + 16 <= n; i += 16) {
        unsigned mask = 0;
        for (int j = 0; j < 4; j++) {
            __m128 r = _mm_loadu_ps(row + i + 4 * j);
            mask |= (unsigned)_mm_movemask_ps(_mm_and_ps(_mm_cmpge_ps(r, l), _mm_cmple_ps(r, h))) << (4 * j);
        }
        for (; mask; mask &= mask - 1) {
#if defined(_MSC_VER)
            unsigned long bit;
            _BitScanForward(&bit, mask);
#else
            unsigned bit = (unsigned)__builtin_ctz(mask);
#endif
            ids[m++] = i + bit;
        }
    }
    return ids_between_c(row, i, n, lo, hi, ids, m);
}

#endif

static double split(const float *row, float *w, Py_ssize_t n, float lo, float hi, double *sums, Py_ssize_t block,
                    int portable) {
#if SSE2
    if (!portable) /* block: a power of two, 8 or more (take checks it), so whole vectors of 4 */
        return split_sse2(row, w, n, lo, hi, sums, block);
#endif
    return split_c(row, w, n, lo, hi, sums, block);
}

static Py_ssize_t ids_between(const float *row, Py_ssize_t n, float lo, float hi, int64_t *ids, int portable) {
#if SSE2
    if (!portable)
        return ids_between_sse2(row, n, lo, hi, ids);
#endif
    return ids_between_c(row, 0, n, lo, hi, ids, 0);
}

#define BUCKETS 64 /* a band is split into this many ranges of logits to find which holds the cut */

static Py_ssize_t narrow(const float *row, float *w, float lo, float hi, double mass, int64_t *ids, Py_ssize_t m,
                         double *sums, Py_ssize_t blocks, Py_ssize_t block) {
    /* Of the band's ids [m], keep the ranges around the one where the weight from the top (the sums', then the
     * band's from its top) reaches mass; ids stay ascending. The ranges above them go into sums, those below are
     * zeroed in w. The ranges' weights are float32 sums: the caller checks the cut in exact weights, and the
     * neighbour ranges either side absorb a rounding difference. Where the band's weight does not reach mass, or
     * sums reach it without the band, the band is left whole. */
    if (!(hi > lo) || !isfinite(lo) || !isfinite(hi) || m == 0)
        return m;
    double weight[BUCKETS] = {0}, reached = 0.0;
    for (Py_ssize_t b = 0; b < blocks; b++)
        reached += sums[b];
    if (reached >= mass)
        return m;
    uint8_t *ranges = malloc((size_t)m);
    if (!ranges) /* the band whole: correct, only slower */
        return m;
    const float scale = BUCKETS / (hi - lo);
    /* range 0 holds the largest logits; a larger logit never falls in a later range */
    for (Py_ssize_t j = 0; j < m; j++) {
        int r = (int)((hi - row[ids[j]]) * scale);
        ranges[j] = (uint8_t)(r < BUCKETS ? r : BUCKETS - 1);
        weight[ranges[j]] += w[ids[j]];
    }
    int at = 0;
    while (at < BUCKETS && reached + weight[at] < mass)
        reached += weight[at++];
    if (at == BUCKETS) {
        free(ranges);
        return m;
    }
    int first = at > 0 ? at - 1 : 0, last = at + 1, shift = 0;
    while ((Py_ssize_t)1 << shift < block) /* block is a power of two: ids' blocks by a shift, not a division */
        shift++;
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < m; j++) { /* without branches: the three cases come in random order */
        int64_t id = ids[j];
        int r = ranges[j];
        sums[id >> shift] += masked(w[id], r < first);
        w[id] = masked(w[id], r <= last);
        ids[kept] = id;
        kept += r >= first && r <= last;
    }
    free(ranges);
    return kept;
}

static int bounds_c(const float *row, Py_ssize_t n, float *largest, float *smallest) {
    /* widens [*smallest, *largest] to hold row [n]; returns whether row holds a NaN (which comparisons skip) */
    float hi[8], lo[8];
    int unordered[8] = {0};
    for (int j = 0; j < 8; j++)
        hi[j] = *largest, lo[j] = *smallest;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            hi[j] = row[i + j] > hi[j] ? row[i + j] : hi[j];
            lo[j] = row[i + j] < lo[j] ? row[i + j] : lo[j];
            unordered[j] |= row[i + j] != row[i + j];
        }
    for (; i < n; i++) {
        hi[0] = row[i] > hi[0] ? row[i] : hi[0];
        lo[0] = row[i] < lo[0] ? row[i] : lo[0];
        unordered[0] |= row[i] != row[i];
    }
    int nan = 0;
    for (int j = 0; j < 8; j++) {
        *largest = hi[j] > *largest ? hi[j] : *largest;
        *smallest = lo[j] < *smallest ? lo[j] : *smallest;
        nan |= unordered[j];
    }
    return nan;
}

static void bounds(const float *row, Py_ssize_t n, float *largest, float *smallest, int portable) {
    /* [*smallest, *largest] of row [n]; *largest is NaN where the row holds a NaN */
    int nan;
#if SSE2
    if (!portable && n >= 16) {
        /* four running maxima and minima: one would wait on the last one's result every step. max and min drop
         * a NaN (they return their second operand), so NaNs are collected apart */
        __m128 hi[4], lo[4], unordered = _mm_setzero_ps();
        for (int j = 0; j < 4; j++) {
            hi[j] = lo[j] = _mm_loadu_ps(row + 4 * j);
            unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(hi[j], hi[j]));
        }
        Py_ssize_t i = 16;
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 4; j++) {
                __m128 x = _mm_loadu_ps(row + i + 4 * j);
                hi[j] = _mm_max_ps(hi[j], x);
                lo[j] = _mm_min_ps(lo[j], x);
                unordered = _mm_or_ps(unordered, _mm_cmpunord_ps(x, x));
            }
        float h[16], l[16];
        for (int j = 0; j < 4; j++) {
            _mm_storeu_ps(h + 4 * j, hi[j]);
            _mm_storeu_ps(l + 4 * j, lo[j]);
        }
        *largest = h[0], *smallest = l[0];
        nan = _mm_movemask_ps(unordered) != 0;
        if (i < n) /* the last ids, where n is not a multiple of 16 */
            nan |= bounds_c(row + i, n - i, largest, smallest);
        for (int j = 0; j < 16; j++) {
            *largest = h[j] > *largest ? h[j] : *largest;
            *smallest = l[j] < *smallest ? l[j] : *smallest;
        }
        if (nan)
            *largest = NAN;
        return;
    }
#endif
    *largest = *smallest = row[0];
    nan = bounds_c(row, n, largest, smallest) || row[0] != row[0];
    if (nan)
        *largest = NAN;
}

static int get(PyObject *obj, Py_buffer *view, int flags, Py_ssize_t itemsize, const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: items of %zd bytes expected", name, itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* what a band entry takes: row, w float32 [n]; sums double [ceil(n / block)]; ids int64 [n] or None */
typedef struct {
    Py_buffer row, w, sums, ids;
    int has_ids;
    Py_ssize_t n, blocks;
} Arrays;

static void release(Arrays *a) {
    PyBuffer_Release(&a->row);
    PyBuffer_Release(&a->w);
    PyBuffer_Release(&a->sums);
    if (a->has_ids)
        PyBuffer_Release(&a->ids);
}

static int take(Arrays *a, PyObject *row, PyObject *w, PyObject *sums, PyObject *ids, Py_ssize_t block) {
    a->has_ids = 0;
    if (get(row, &a->row, PyBUF_FORMAT, 4, "row") < 0)
        return -1;
    if (get(w, &a->w, PyBUF_FORMAT | PyBUF_WRITABLE, 4, "w") < 0) {
        PyBuffer_Release(&a->row);
        return -1;
    }
    if (get(sums, &a->sums, PyBUF_FORMAT | PyBUF_WRITABLE, 8, "sums") < 0) {
        PyBuffer_Release(&a->row);
        PyBuffer_Release(&a->w);
        return -1;
    }
    if (ids != Py_None) {
        if (get(ids, &a->ids, PyBUF_FORMAT | PyBUF_WRITABLE, 8, "ids") < 0) {
            PyBuffer_Release(&a->row);
            PyBuffer_Release(&a->w);
            PyBuffer_Release(&a->sums);
            return -1;
        }
        a->has_ids = 1;
    }
    a->n = a->row.len / 4, a->blocks = a->sums.len / 8;
    if (block < 8 || (block & (block - 1)) || a->w.len != a->row.len || a->blocks != (a->n + block - 1) / block
        || (a->has_ids && a->ids.len / 8 < a->n)) {
        PyErr_SetString(PyExc_ValueError, "w must match row, sums hold one item per block (a power of two, 8 ids "
                                          "or more), ids as many items as row");
        release(a);
        return -1;
    }
    return 0;
}

static PyObject *band(PyObject *self, PyObject *args) {
    /* band(row, w, lo, hi, top_p, sums, block, ids, portable=False) -> (total, m): top-p's band over weights w
     * (see the top of this file); total is w's sum before, ids[:m] the band */
    PyObject *row_obj, *w_obj, *sums_obj, *ids_obj;
    float lo, hi;
    double top_p;
    Py_ssize_t block;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "OOffdOnO|p", &row_obj, &w_obj, &lo, &hi, &top_p, &sums_obj, &block, &ids_obj,
                          &portable))
        return NULL;
    Arrays a;
    if (take(&a, row_obj, w_obj, sums_obj, ids_obj, block) < 0)
        return NULL;
    if (!a.has_ids) {
        release(&a);
        PyErr_SetString(PyExc_ValueError, "band: ids are needed");
        return NULL;
    }
    double total;
    Py_ssize_t m;
    Py_BEGIN_ALLOW_THREADS
    total = split(a.row.buf, a.w.buf, a.n, lo, hi, a.sums.buf, block, portable);
    m = ids_between(a.row.buf, a.n, lo, hi, a.ids.buf, portable);
    m = narrow(a.row.buf, a.w.buf, lo, hi, top_p * total, a.ids.buf, m, a.sums.buf, a.blocks, block);
    Py_END_ALLOW_THREADS
    release(&a);
    return Py_BuildValue("dn", total, m);
}

double weights_avx2(const float *row, float *w, ptrdiff_t n, float scale, float scale_lo, float shift, float floor,
                    float lo, float hi, double *sums, ptrdiff_t block, int64_t *ids, ptrdiff_t *m);
int wide_available(void);
static int wide; /* the CPU runs weights_avx2 */

static PyObject *weights(PyObject *self, PyObject *args) {
    /* weights(row, w, scale, scale_lo, shift, floor, lo, hi, top_p, sums, block, ids) -> (total, m): w =
     * exp((row - shift) * (scale + scale_lo)), 0 below floor, and top-p's band over them (see the top of this file); ids None: no band (lo = hi
     * = -inf then gives every block's weight in sums). Where WIDE is true only. */
    PyObject *row_obj, *w_obj, *sums_obj, *ids_obj;
    float scale, scale_lo, shift, floor, lo, hi;
    double top_p;
    Py_ssize_t block;
    if (!PyArg_ParseTuple(args, "OOffffffdOnO", &row_obj, &w_obj, &scale, &scale_lo, &shift, &floor, &lo, &hi, &top_p,
                          &sums_obj, &block, &ids_obj))
        return NULL;
    if (!wide) {
        PyErr_SetString(PyExc_RuntimeError, "weights: this CPU lacks AVX2 and FMA (see WIDE)");
        return NULL;
    }
    Arrays a;
    if (take(&a, row_obj, w_obj, sums_obj, ids_obj, block) < 0)
        return NULL;
    if (a.has_ids && a.ids.len / 8 < a.n + 8) {
        release(&a);
        PyErr_SetString(PyExc_ValueError, "weights: ids must hold n + 8 items");
        return NULL;
    }
    double total;
    Py_ssize_t m = 0;
    Py_BEGIN_ALLOW_THREADS
    total = weights_avx2(a.row.buf, a.w.buf, a.n, scale, scale_lo, shift, floor, lo, hi, a.sums.buf, block,
                         a.has_ids ? a.ids.buf : NULL, &m);
    if (a.has_ids)
        m = narrow(a.row.buf, a.w.buf, lo, hi, top_p * total, a.ids.buf, m, a.sums.buf, a.blocks, block);
    Py_END_ALLOW_THREADS
    release(&a);
    return Py_BuildValue("dn", total, m);
}

static PyObject *between(PyObject *self, PyObject *args) {
    /* between(row, lo, hi, ids, portable=False) -> m: ids[:m] are the ascending ids where lo <= row <= hi */
    PyObject *row_obj, *ids_obj;
    float lo, hi;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "OffO|p", &row_obj, &lo, &hi, &ids_obj, &portable))
        return NULL;
    Py_buffer row, ids;
    if (get(row_obj, &row, PyBUF_FORMAT, 4, "row") < 0)
        return NULL;
    if (get(ids_obj, &ids, PyBUF_FORMAT | PyBUF_WRITABLE, 8, "ids") < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    Py_ssize_t n = row.len / 4, m = -1;
    if (ids.len / 8 >= n) {
        Py_BEGIN_ALLOW_THREADS
        m = ids_between(row.buf, n, lo, hi, ids.buf, portable);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "between: ids must hold as many items as row");
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&ids);
    return m < 0 ? NULL : PyLong_FromSsize_t(m);
}

static PyObject *extent(PyObject *self, PyObject *args) {
    /* extent(row, portable=False) -> (largest, smallest) of a row [n >= 1]; largest is NaN where it holds one */
    PyObject *row_obj;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "O|p", &row_obj, &portable))
        return NULL;
    Py_buffer row;
    if (get(row_obj, &row, PyBUF_FORMAT, 4, "row") < 0)
        return NULL;
    Py_ssize_t n = row.len / 4;
    if (n == 0) {
        PyBuffer_Release(&row);
        PyErr_SetString(PyExc_ValueError, "extent: an empty row");
        return NULL;
    }
    float largest, smallest;
    Py_BEGIN_ALLOW_THREADS
    bounds(row.buf, n, &largest, &smallest, portable);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&row);
    return Py_BuildValue("ff", largest, smallest);
}

static PyMethodDef methods[] = {
    {"band", band, METH_VARARGS, "band(row, w, lo, hi, top_p, sums, block, ids, portable=False) -> (total, m)"},
    {"weights", weights, METH_VARARGS,
     "weights(row, w, scale, scale_lo, shift, floor, lo, hi, top_p, sums, block, ids) -> (total, m)"},
    {"between", between, METH_VARARGS, "between(row, lo, hi, ids, portable=False) -> m"},
    {"extent", extent, METH_VARARGS, "extent(row, portable=False) -> (largest, smallest)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", "Fused passes over a row of logits", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) {
    PyObject *m = PyModule_Create(&module);
    wide = wide_available();
    if (m && (PyModule_AddIntConstant(m, "WIDE", wide) < 0 || PyModule_AddIntConstant(m, "SSE2", SSE2) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
