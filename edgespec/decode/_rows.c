/* Passes over one row of a 152k vocabulary that numpy can only make as several (a mask, a cast, a multiply, a
 * nonzero), each reading the row again. decode/rows.py is the only caller and holds the numpy equivalent that
 * runs where this module was not built; tests/test_rows.py checks the two agree.
 *
 * Arguments are C-contiguous buffers checked by rows.py: row and w float32 [n], ids int64 [n].
 * Weights are summed in float32 over CHUNK ids at a time and the chunks in double (numpy's pairwise sum is as
 * close). x86-64 runs SSE2 versions of the passes, other CPUs the portable C ones; `portable` asks for those. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define SSE2 1 /* every x86-64 CPU has it: one build runs on all of them */
#else
#define SSE2 0
#endif

#define CHUNK 1024 /* float32 sums run over this many ids, then go into a double */

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

static void weigh_c(const float *row, const float *w, Py_ssize_t n, float hi, double *above, double *total) {
    /* *above += the weight where row > hi, *total += all the weight */
    for (Py_ssize_t i = 0; i < n; i += CHUNK) {
        float up[8] = {0}, all[8] = {0};
        Py_ssize_t end = i + CHUNK < n ? i + CHUNK : n, k = i;
        for (; k + 8 <= end; k += 8)
            for (int j = 0; j < 8; j++) {
                up[j] += masked(w[k + j], row[k + j] > hi);
                all[j] += w[k + j];
            }
        for (; k < end; k++) {
            up[0] += masked(w[k], row[k] > hi);
            all[0] += w[k];
        }
        for (int j = 0; j < 8; j++) {
            *above += up[j];
            *total += all[j];
        }
    }
}

static Py_ssize_t ids_between_c(const float *row, Py_ssize_t from, Py_ssize_t n, float lo, float hi,
                                int64_t *ids, Py_ssize_t m) {
    for (Py_ssize_t i = from; i < n; i++) {
        ids[m] = i; /* always stored, kept where the logit is inside: no branch */
        m += (row[i] >= lo) & (row[i] <= hi);
    }
    return m;
}

static void zero_below_c(const float *row, float *w, Py_ssize_t from, Py_ssize_t n, float cut) {
    for (Py_ssize_t i = from; i < n; i++)
        w[i] = masked(w[i], row[i] >= cut);
}

static double sum_c(const float *w, Py_ssize_t n) {
    float lanes[8] = {0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lanes[j] += w[i + j];
    double total = 0.0;
    for (; i < n; i++)
        total += w[i];
    for (int j = 0; j < 8; j++)
        total += lanes[j];
    return total;
}

#if SSE2
static void weigh_sse2(const float *row, const float *w, Py_ssize_t n, float hi, double *above, double *total) {
    const __m128 h = _mm_set1_ps(hi);
    Py_ssize_t i = 0;
    for (; i + CHUNK <= n; i += CHUNK) {
        __m128 up[4], all[4];
        for (int j = 0; j < 4; j++)
            up[j] = all[j] = _mm_setzero_ps();
        for (Py_ssize_t k = i; k < i + CHUNK; k += 16)
            for (int j = 0; j < 4; j++) {
                __m128 x = _mm_loadu_ps(w + k + 4 * j);
                up[j] = _mm_add_ps(up[j], _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(row + k + 4 * j), h), x));
                all[j] = _mm_add_ps(all[j], x);
            }
        float lanes[32];
        for (int j = 0; j < 4; j++) {
            _mm_storeu_ps(lanes + 4 * j, up[j]);
            _mm_storeu_ps(lanes + 16 + 4 * j, all[j]);
        }
        for (int j = 0; j < 16; j++) {
            *above += lanes[j];
            *total += lanes[16 + j];
        }
    }
    weigh_c(row + i, w + i, n - i, hi, above, total);
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

static void zero_below_sse2(const float *row, float *w, Py_ssize_t n, float cut) {
    const __m128 c = _mm_set1_ps(cut);
    Py_ssize_t i = 0;
    for (; i + 4 <= n; i += 4)
        _mm_storeu_ps(w + i, _mm_and_ps(_mm_cmpge_ps(_mm_loadu_ps(row + i), c), _mm_loadu_ps(w + i)));
    zero_below_c(row, w, i, n, cut);
}

static double sum_sse2(const float *w, Py_ssize_t n) {
    __m128 s[4] = {_mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps(), _mm_setzero_ps()};
    Py_ssize_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 4; j++)
            s[j] = _mm_add_ps(s[j], _mm_loadu_ps(w + i + 4 * j));
    float lanes[16];
    for (int j = 0; j < 4; j++)
        _mm_storeu_ps(lanes + 4 * j, s[j]);
    double total = sum_c(w + i, n - i);
    for (int j = 0; j < 16; j++)
        total += lanes[j];
    return total;
}
#endif

static void weigh(const float *row, const float *w, Py_ssize_t n, float hi, double *above, double *total,
                  int portable) {
    *above = *total = 0.0;
#if SSE2
    if (!portable) {
        weigh_sse2(row, w, n, hi, above, total);
        return;
    }
#endif
    weigh_c(row, w, n, hi, above, total);
}

static Py_ssize_t ids_between(const float *row, Py_ssize_t n, float lo, float hi, int64_t *ids, int portable) {
#if SSE2
    if (!portable)
        return ids_between_sse2(row, n, lo, hi, ids);
#endif
    return ids_between_c(row, 0, n, lo, hi, ids, 0);
}

static void zero_below(const float *row, float *w, Py_ssize_t n, float cut, double *sums, Py_ssize_t block,
                       int portable) {
    /* block by block, so that each block's sum is taken while it is in cache */
    for (Py_ssize_t i = 0, b = 0; i < n; i += block, b++) {
        Py_ssize_t len = i + block <= n ? block : n - i;
#if SSE2
        if (!portable) {
            zero_below_sse2(row + i, w + i, len, cut);
            sums[b] = sum_sse2(w + i, len);
            continue;
        }
#endif
        zero_below_c(row + i, w + i, 0, len, cut);
        sums[b] = sum_c(w + i, len);
    }
}

#define BUCKETS 64 /* a band is split into this many ranges of logits to find which holds the cut */

static Py_ssize_t narrow(const float *row, const float *w, float lo, float hi, double mass, int64_t *ids,
                         Py_ssize_t m, double *above) {
    /* Of the band's ids [m], keep the ranges around the one where the weight from the top reaches mass (ids
     * stay ascending); *above grows by the weight of the ranges above them. The ranges' weights are sums of
     * float32 weights: the caller checks the cut against exact ones and the neighbour ranges either side absorb
     * a rounding difference. Where the band's weight does not reach mass it is left whole. */
    if (!(hi > lo) || m == 0)
        return m;
    double weight[BUCKETS] = {0};
    const float scale = BUCKETS / (hi - lo);
#define RANGE(x) ((int)((hi - (x)) * scale) < BUCKETS ? (int)((hi - (x)) * scale) : BUCKETS - 1)
    /* range 0 holds the largest logits; a larger logit never falls in a later range */
    for (Py_ssize_t j = 0; j < m; j++)
        weight[RANGE(row[ids[j]])] += w[ids[j]];
    double reached = *above;
    int at = 0;
    while (at < BUCKETS && reached + weight[at] < mass)
        reached += weight[at++];
    if (at == BUCKETS)
        return m;
    int first = at > 0 ? at - 1 : 0, last = at + 1;
    for (int b = 0; b < first; b++)
        *above += weight[b];
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < m; j++) {
        int r = RANGE(row[ids[j]]);
        ids[kept] = ids[j];
        kept += (r >= first) & (r <= last);
    }
#undef RANGE
    return kept;
}

static void bounds_c(const float *row, Py_ssize_t n, float *largest, float *smallest) {
    float hi[8], lo[8];
    for (int j = 0; j < 8; j++)
        hi[j] = lo[j] = row[0];
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            hi[j] = row[i + j] > hi[j] ? row[i + j] : hi[j];
            lo[j] = row[i + j] < lo[j] ? row[i + j] : lo[j];
        }
    for (; i < n; i++) {
        hi[0] = row[i] > hi[0] ? row[i] : hi[0];
        lo[0] = row[i] < lo[0] ? row[i] : lo[0];
    }
    *largest = hi[0], *smallest = lo[0];
    for (int j = 1; j < 8; j++) {
        *largest = hi[j] > *largest ? hi[j] : *largest;
        *smallest = lo[j] < *smallest ? lo[j] : *smallest;
    }
}

static void bounds(const float *row, Py_ssize_t n, float *largest, float *smallest, int portable) {
#if SSE2
    if (!portable && n >= 16) {
        __m128 hi = _mm_loadu_ps(row), lo = hi;
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4) {
            __m128 x = _mm_loadu_ps(row + i);
            hi = _mm_max_ps(hi, x);
            lo = _mm_min_ps(lo, x);
        }
        float h[4], l[4];
        _mm_storeu_ps(h, hi);
        _mm_storeu_ps(l, lo);
        float tail_hi, tail_lo;
        bounds_c(row + n - 4, 4, &tail_hi, &tail_lo); /* the last ids, if n is not a multiple of 4 */
        *largest = tail_hi, *smallest = tail_lo;
        for (int j = 0; j < 4; j++) {
            *largest = h[j] > *largest ? h[j] : *largest;
            *smallest = l[j] < *smallest ? l[j] : *smallest;
        }
        return;
    }
#endif
    bounds_c(row, n, largest, smallest);
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

static PyObject *band(PyObject *self, PyObject *args) {
    /* band(row, w, lo, hi, top_p, ids, portable=False) -> (above, total, m): total is w's sum; ids[:m] are
     * ascending ids of logits in [lo, hi], narrowed to the ranges where the weight from the top reaches
     * top_p * total; above is the weight of w over the logits larger than all of them. ids holds n items. */
    PyObject *row_obj, *w_obj, *ids_obj;
    float lo, hi;
    double top_p;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "OOffdO|p", &row_obj, &w_obj, &lo, &hi, &top_p, &ids_obj, &portable))
        return NULL;
    Py_buffer row, w, ids;
    if (get(row_obj, &row, PyBUF_FORMAT, 4, "row") < 0)
        return NULL;
    if (get(w_obj, &w, PyBUF_FORMAT, 4, "w") < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    if (get(ids_obj, &ids, PyBUF_FORMAT | PyBUF_WRITABLE, 8, "ids") < 0) {
        PyBuffer_Release(&row);
        PyBuffer_Release(&w);
        return NULL;
    }
    Py_ssize_t n = row.len / 4;
    PyObject *out = NULL;
    if (w.len / 4 != n || ids.len / 8 < n) {
        PyErr_SetString(PyExc_ValueError, "band: w must match row, ids hold as many items");
    } else {
        double above, total;
        Py_ssize_t m;
        Py_BEGIN_ALLOW_THREADS
        weigh(row.buf, w.buf, n, hi, &above, &total, portable);
        m = ids_between(row.buf, n, lo, hi, ids.buf, portable);
        if (above < top_p * total)
            m = narrow(row.buf, w.buf, lo, hi, top_p * total, ids.buf, m, &above);
        Py_END_ALLOW_THREADS
        out = Py_BuildValue("ddn", above, total, m);
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&w);
    PyBuffer_Release(&ids);
    return out;
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
    /* extent(row, portable=False) -> (largest, smallest) of a row [n >= 1] without NaN */
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

static PyObject *keep_from(PyObject *self, PyObject *args) {
    /* keep_from(row, w, cut, sums, block, portable=False): w = 0 where row < cut, in place; sums
     * [ceil(n / block)] receive the kept weight per block of ids (double) */
    PyObject *row_obj, *w_obj, *sums_obj;
    float cut;
    Py_ssize_t block;
    int portable = 0;
    if (!PyArg_ParseTuple(args, "OOfOn|p", &row_obj, &w_obj, &cut, &sums_obj, &block, &portable))
        return NULL;
    Py_buffer row, w, sums;
    if (get(row_obj, &row, PyBUF_FORMAT, 4, "row") < 0)
        return NULL;
    if (get(w_obj, &w, PyBUF_FORMAT | PyBUF_WRITABLE, 4, "w") < 0) {
        PyBuffer_Release(&row);
        return NULL;
    }
    if (get(sums_obj, &sums, PyBUF_FORMAT | PyBUF_WRITABLE, 8, "sums") < 0) {
        PyBuffer_Release(&row);
        PyBuffer_Release(&w);
        return NULL;
    }
    Py_ssize_t n = row.len / 4;
    int ok = w.len == row.len && block > 0 && sums.len / 8 == (n + block - 1) / block;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        zero_below(row.buf, w.buf, n, cut, sums.buf, block, portable);
        Py_END_ALLOW_THREADS
    } else {
        PyErr_SetString(PyExc_ValueError, "keep_from: w must match row, sums hold one item per block");
    }
    PyBuffer_Release(&row);
    PyBuffer_Release(&w);
    PyBuffer_Release(&sums);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"band", band, METH_VARARGS, "band(row, w, lo, hi, top_p, ids, portable=False) -> (above, total, m)"},
    {"between", between, METH_VARARGS, "between(row, lo, hi, ids, portable=False) -> m"},
    {"extent", extent, METH_VARARGS, "extent(row, portable=False) -> (largest, smallest)"},
    {"keep_from", keep_from, METH_VARARGS, "keep_from(row, w, cut, sums, block, portable=False): zero w where row < cut, sums per block"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", "Fused passes over a row of logits", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
