/* A row's weights exp((logit - shift) / temperature) in one AVX2 pass that also makes top-p's band: numpy needs
 * five passes for the same (a multiply, an exp, a mask, block sums, a nonzero), and at 152k logits each pass
 * costs more in memory traffic than in arithmetic. Built for x86-64 with GCC or Clang and chosen at run time
 * where the CPU has AVX2 and FMA (_rows.c asks wide_available); elsewhere numpy makes the weights.
 *
 * exp is Cephes' expf (as in sse_mathfun and ggml), within 2 ulp of the exact value on the range used here. */

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,fma")))

/* COMPRESS[mask]: the positions of mask's set bits, lowest first: one permutation moves the ids of a vector's
 * logits inside the band to its front, without a branch per id */
static int32_t COMPRESS[256][8];

int wide_available(void) {
    for (int mask = 0; mask < 256; mask++)
        for (int bit = 0, k = 0; bit < 8; bit++)
            if (mask >> bit & 1)
                COMPRESS[mask][k++] = bit;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

TARGET static inline __m256 exp8(__m256 x) {
    /* exp(x) = 2^k exp(r), k = floor(x log2(e) + 1/2), r = x - k ln(2) (ln(2) in two parts), exp(r) a degree-7
     * polynomial. x is clamped where 2^k stays a normal float: weights below are zeroed by the caller */
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 k = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(bits));
}

TARGET double weights_avx2(const float *row, float *w, ptrdiff_t n, float scale, float scale_lo, float shift,
                           float floor, float lo, float hi, double *sums, ptrdiff_t block, int64_t *ids, ptrdiff_t *m) {
    /* w = exp((row - shift) * (scale + scale_lo)) where row >= max(floor, lo), else 0; sums[b] = the weight of block b's
     * logits above hi; ids (where not NULL, n + 8 items) receive the ids of logits in [lo, hi], *m their
     * number. Returns the whole weight (below lo included). block is a multiple of 8, n < 2^31. */
    const __m256 s = _mm256_set1_ps(scale), s_lo = _mm256_set1_ps(scale_lo), o = _mm256_set1_ps(shift);
    const __m256 f = _mm256_set1_ps(floor);
    const __m256 l = _mm256_set1_ps(lo), h = _mm256_set1_ps(hi);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    double total = 0.0;
    ptrdiff_t kept = 0;
    for (ptrdiff_t start = 0, b = 0; start < n; start += block, b++) {
        ptrdiff_t end = start + block < n ? start + block : n;
        __m256 all = _mm256_setzero_ps(), up = _mm256_setzero_ps();
        for (ptrdiff_t i = start; i < end; i += 8) {
            /* the row's last ids, where n is not a multiple of 8, through masked loads and stores */
            __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(end - i < 8 ? end - i : 8)), lane);
            __m256 r = end - i >= 8 ? _mm256_loadu_ps(row + i) : _mm256_maskload_ps(row + i, valid);
            __m256 keep = _mm256_and_ps(_mm256_cmp_ps(r, f, _CMP_GE_OQ), _mm256_castsi256_ps(valid));
            /* the difference first: exact or nearly so for the logits near the shift (the ones that weigh), where
             * row * scale - shift * scale would round each product at the row's magnitude; 1 / temperature in two
             * parts, so that its rounding does not bend every weight the same way */
            __m256 d = _mm256_sub_ps(r, o);
            __m256 e = _mm256_and_ps(exp8(_mm256_fmadd_ps(d, s, _mm256_mul_ps(d, s_lo))), keep);
            all = _mm256_add_ps(all, e);
            up = _mm256_add_ps(up, _mm256_and_ps(e, _mm256_cmp_ps(r, h, _CMP_GT_OQ)));
            __m256 from_lo = _mm256_and_ps(_mm256_cmp_ps(r, l, _CMP_GE_OQ), _mm256_castsi256_ps(valid));
            if (end - i >= 8)
                _mm256_storeu_ps(w + i, _mm256_and_ps(e, from_lo));
            else
                _mm256_maskstore_ps(w + i, valid, _mm256_and_ps(e, from_lo));
            if (ids) { /* 8 ids stored, as many as are inside kept */
                int mask = _mm256_movemask_ps(_mm256_and_ps(from_lo, _mm256_cmp_ps(r, h, _CMP_LE_OQ)));
                __m256i at = _mm256_add_epi32(_mm256_set1_epi32((int32_t)i),
                                              _mm256_loadu_si256((const __m256i *)COMPRESS[mask]));
                _mm256_storeu_si256((__m256i *)(ids + kept), _mm256_cvtepi32_epi64(_mm256_castsi256_si128(at)));
                _mm256_storeu_si256((__m256i *)(ids + kept + 4),
                                    _mm256_cvtepi32_epi64(_mm256_extracti128_si256(at, 1)));
                kept += __builtin_popcount((unsigned)mask);
            }
        }
        float lanes[16];
        _mm256_storeu_ps(lanes, all);
        _mm256_storeu_ps(lanes + 8, up);
        double block_all = 0.0, block_up = 0.0;
        for (int j = 0; j < 8; j++) {
            block_all += lanes[j];
            block_up += lanes[8 + j];
        }
        total += block_all;
        sums[b] = block_up;
    }
    *m = kept;
    return total;
}

#else

int wide_available(void) { return 0; }

double weights_avx2(const float *row, float *w, ptrdiff_t n, float scale, float scale_lo, float shift, float floor,
                    float lo, float hi, double *sums, ptrdiff_t block, int64_t *ids, ptrdiff_t *m) {
    (void)row, (void)w, (void)n, (void)scale, (void)scale_lo, (void)shift, (void)floor, (void)lo, (void)hi, (void)sums;
    (void)block, (void)ids, (void)m;
    return 0.0; /* never called: wide_available() is 0 */
}

#endif
