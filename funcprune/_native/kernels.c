/* funcprune's optional native kernels (see README.md beside this file).
 *
 * Plain C: no torch headers, so that a C compiler builds this file in about
 * a second, the first time it is needed; _build.py loads the library
 * through ctypes and passes the tensors' data pointers. Each kernel is one
 * pass over contiguous memory that replaces several torch passes, and gives
 * exactly what the pure-torch path of the same step gives (that path stays,
 * and is what runs without a compiler). IEEE arithmetic only: no fast-math.
 *
 * Threads: built with -fopenmp, the library needs libgomp.so.1, which is the
 * copy torch has loaded already (Linux wheels ship theirs under that name):
 * the kernels then run on torch's own OpenMP workers, `threads` of them (the
 * caller passes torch.get_num_threads()), and never compete with them.
 * Threads of the kernels' own (pthreads) measured no faster on 2 cores, as
 * torch's workers spin for a while after each parallel op. Built without
 * OpenMP (fp_openmp() returns 0), every kernel runs in the calling thread.
 * The tie-breaking survivors pass runs in one thread: its result depends on
 * the order of the ties.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PIECES 256

int fp_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

/* ---- weight * mask for a bool mask: one pass, the float product's bits ---- */

#define MASK_MULTIPLY(NAME, T)                                                        \
    void NAME(const T *restrict x, const uint8_t *restrict m, T *restrict out, int64_t n, \
              int threads) {                                                          \
        (void)threads; /* without OpenMP */                                           \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")            \
        for (int64_t i = 0; i < n; i++) out[i] = x[i] * (T)m[i];                      \
    }

MASK_MULTIPLY(fp_mask_multiply_f32, float)
MASK_MULTIPLY(fp_mask_multiply_f64, double)

/* ---- the bracket scan: count keys below lo, collect those in [lo, hi] ----
 *
 * key(i) = |x[i]| (absolute) or x[i], +inf where eligible[i] is 0 (eligible
 * may be NULL: all eligible). NaN is neither below nor inside. The keys
 * inside are written in index order to `inside`, at most `capacity` of them;
 * the return value is how many there are (more than `capacity`: the caller
 * must not use `inside`). `below` receives the count below.
 */

/* k where the eligible byte is 1, +inf where it is 0, without a branch. */
static inline float keep_or_inf_f32(float k, uint8_t eligible) {
    uint32_t bits, inf, select = -(uint32_t)(eligible != 0);
    float infinity = INFINITY;
    memcpy(&bits, &k, sizeof bits);
    memcpy(&inf, &infinity, sizeof inf);
    bits = (bits & select) | (inf & ~select);
    memcpy(&k, &bits, sizeof k);
    return k;
}

static inline double keep_or_inf_f64(double k, uint8_t eligible) {
    uint64_t bits, inf, select = -(uint64_t)(eligible != 0);
    double infinity = INFINITY;
    memcpy(&bits, &k, sizeof bits);
    memcpy(&inf, &infinity, sizeof inf);
    bits = (bits & select) | (inf & ~select);
    memcpy(&k, &bits, sizeof k);
    return k;
}

/* Where the compiler targets AVX2 (AVX-512 included): row b of lane_pack holds
 * the lanes (of 8, 32-bit) set in b, first, then zeros; row b < 16 of
 * lane_pack_pairs, the 32-bit halves of the lanes (of 4, 64-bit) set in b.
 * Moving the lanes that pass a test to the front, as a compress store does,
 * is one permutation by the row of their bits (the bracket's scan without
 * AVX-512, the per-row selection's collecting pass). Filled when the
 * library loads. */
#if defined(__AVX2__)
#include <immintrin.h>

static int32_t lane_pack[256][8], lane_pack_pairs[16][8];

__attribute__((constructor)) static void lane_pack_fill(void) {
    for (int b = 0; b < 256; b++) {
        int f = 0;
        for (int l = 0; l < 8; l++)
            if (b >> l & 1) lane_pack[b][f++] = l;
        while (f < 8) lane_pack[b][f++] = 0;
    }
    for (int b = 0; b < 16; b++) {
        int f = 0;
        for (int l = 0; l < 4; l++)
            if (b >> l & 1) {
                lane_pack_pairs[b][f++] = 2 * l;
                lane_pack_pairs[b][f++] = 2 * l + 1;
            }
        while (f < 8) lane_pack_pairs[b][f++] = 0;
    }
}
#define LANE_PACK ((const int32_t(*)[8])lane_pack)

/* The sum of a vector's lanes: counts kept a lane each, added at the end of a pass. */
static inline int64_t lanes_sum_epi32(__m256i v) {
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, v);
    int64_t total = 0;
    for (int l = 0; l < 8; l++) total += lanes[l];
    return total;
}

static inline int64_t lanes_sum_epi64(__m256i v) {
    int64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, v);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#else
#define LANE_PACK ((const int32_t(*)[8])NULL)
#endif

/* The scan's inner step, 16 floats (8 doubles) at a time where the compiler
 * targets AVX-512, 8 (4) where it targets AVX2: adds the count below lo to
 * *below, stores the keys inside [lo, hi] at out + *found (a full vector's
 * room is needed there) and moves *found on; returns how many keys it looked
 * at (a multiple of the width; the caller finishes the rest). Elsewhere it
 * looks at none. Comparisons are ordered and quiet, as C's: NaN is neither
 * below nor inside. AVX2 has no compress store: the lanes inside are moved
 * to the front by a permutation looked up by their bits (lane_pack). */
#if defined(__AVX512F__)
#include <immintrin.h>

static inline int64_t vector_scan_f32(const float *x, const uint8_t *e, int64_t n, int absolute, float lo_,
                                      float hi_, float *out, int64_t *below, int64_t *found) {
    const __m512 lo = _mm512_set1_ps(lo_), hi = _mm512_set1_ps(hi_), inf = _mm512_set1_ps(INFINITY);
    int64_t i = 0, count = 0, f = *found;
    for (; i + 16 <= n; i += 16) {
        __m512 k = _mm512_loadu_ps(x + i);
        if (absolute) k = _mm512_abs_ps(k);
        if (e) {
            __m512i flags = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(e + i)));
            k = _mm512_mask_blend_ps(_mm512_test_epi32_mask(flags, flags), inf, k);
        }
        count += __builtin_popcount(_mm512_cmp_ps_mask(k, lo, _CMP_LT_OQ));
        __mmask16 in = _mm512_cmp_ps_mask(k, lo, _CMP_GE_OQ) & _mm512_cmp_ps_mask(k, hi, _CMP_LE_OQ);
        _mm512_storeu_ps(out + f, _mm512_maskz_compress_ps(in, k));
        f += __builtin_popcount(in);
    }
    *below += count;
    *found = f;
    return i;
}

static inline int64_t vector_scan_f64(const double *x, const uint8_t *e, int64_t n, int absolute, double lo_,
                                      double hi_, double *out, int64_t *below, int64_t *found) {
    const __m512d lo = _mm512_set1_pd(lo_), hi = _mm512_set1_pd(hi_), inf = _mm512_set1_pd(INFINITY);
    int64_t i = 0, count = 0, f = *found;
    for (; i + 8 <= n; i += 8) {
        __m512d k = _mm512_loadu_pd(x + i);
        if (absolute) k = _mm512_abs_pd(k);
        if (e) {
            __m512i flags = _mm512_cvtepu8_epi64(_mm_loadl_epi64((const __m128i *)(e + i)));
            k = _mm512_mask_blend_pd(_mm512_test_epi64_mask(flags, flags), inf, k);
        }
        count += __builtin_popcount(_mm512_cmp_pd_mask(k, lo, _CMP_LT_OQ));
        __mmask8 in = _mm512_cmp_pd_mask(k, lo, _CMP_GE_OQ) & _mm512_cmp_pd_mask(k, hi, _CMP_LE_OQ);
        _mm512_storeu_pd(out + f, _mm512_maskz_compress_pd(in, k));
        f += __builtin_popcount(in);
    }
    *below += count;
    *found = f;
    return i;
}
#elif defined(__AVX2__)
static inline int64_t vector_scan_f32(const float *x, const uint8_t *e, int64_t n, int absolute, float lo_,
                                      float hi_, float *out, int64_t *below, int64_t *found) {
    const __m256 lo = _mm256_set1_ps(lo_), hi = _mm256_set1_ps(hi_), inf = _mm256_set1_ps(INFINITY);
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256i zero = _mm256_setzero_si256();
    __m256i count = zero;
    int64_t i = 0, f = *found;
    for (; i + 8 <= n; i += 8) {
        __m256 k = _mm256_loadu_ps(x + i);
        if (absolute) k = _mm256_and_ps(k, magnitude);
        if (e) {
            __m256i flags = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(e + i)));
            k = _mm256_blendv_ps(k, inf, _mm256_castsi256_ps(_mm256_cmpeq_epi32(flags, zero)));
        }
        count = _mm256_sub_epi32(count, _mm256_castps_si256(_mm256_cmp_ps(k, lo, _CMP_LT_OQ)));
        __m256 in = _mm256_and_ps(_mm256_cmp_ps(k, lo, _CMP_GE_OQ), _mm256_cmp_ps(k, hi, _CMP_LE_OQ));
        int bits = _mm256_movemask_ps(in);
        __m256i order = _mm256_loadu_si256((const __m256i *)lane_pack[bits]);
        _mm256_storeu_ps(out + f, _mm256_permutevar8x32_ps(k, order));
        f += __builtin_popcount((unsigned)bits);
    }
    *below += lanes_sum_epi32(count); /* (the caller passes at most 256 keys a call) */
    *found = f;
    return i;
}

static inline int64_t vector_scan_f64(const double *x, const uint8_t *e, int64_t n, int absolute, double lo_,
                                      double hi_, double *out, int64_t *below, int64_t *found) {
    const __m256d lo = _mm256_set1_pd(lo_), hi = _mm256_set1_pd(hi_), inf = _mm256_set1_pd(INFINITY);
    const __m256d magnitude = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7FFFFFFFFFFFFFFFLL));
    const __m256i zero = _mm256_setzero_si256();
    __m256i count = zero;
    int64_t i = 0, f = *found;
    for (; i + 4 <= n; i += 4) {
        __m256d k = _mm256_loadu_pd(x + i);
        if (absolute) k = _mm256_and_pd(k, magnitude);
        if (e) {
            int32_t four;
            memcpy(&four, e + i, sizeof four);
            __m256i flags = _mm256_cvtepu8_epi64(_mm_cvtsi32_si128(four));
            k = _mm256_blendv_pd(k, inf, _mm256_castsi256_pd(_mm256_cmpeq_epi64(flags, zero)));
        }
        count = _mm256_sub_epi64(count, _mm256_castpd_si256(_mm256_cmp_pd(k, lo, _CMP_LT_OQ)));
        __m256d in = _mm256_and_pd(_mm256_cmp_pd(k, lo, _CMP_GE_OQ), _mm256_cmp_pd(k, hi, _CMP_LE_OQ));
        int bits = _mm256_movemask_pd(in);
        __m256i order = _mm256_loadu_si256((const __m256i *)lane_pack_pairs[bits]);
        __m256i packed = _mm256_permutevar8x32_epi32(_mm256_castpd_si256(k), order);
        _mm256_storeu_si256((__m256i *)(out + f), packed);
        f += __builtin_popcount((unsigned)bits);
    }
    *below += lanes_sum_epi64(count);
    *found = f;
    return i;
}
#else
static inline int64_t vector_scan_f32(const float *x, const uint8_t *e, int64_t n, int absolute, float lo,
                                      float hi, float *out, int64_t *below, int64_t *found) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)out, (void)below, (void)found;
    return 0;
}

static inline int64_t vector_scan_f64(const double *x, const uint8_t *e, int64_t n, int absolute, double lo,
                                      double hi, double *out, int64_t *below, int64_t *found) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)out, (void)below, (void)found;
    return 0;
}
#endif

#define SCAN(NAME, T, ABS, BLEND, VECTOR)                                             \
    /* Branch-free: every key is written at inside[found], which moves on only  \
       past a key inside; a block runs so, unchecked, while all its keys fit. */ \
    static inline __attribute__((always_inline)) int64_t NAME##_run(                 \
        const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute,      \
        T lo, T hi, T *restrict inside, int64_t capacity, int64_t *below_out) {       \
        int64_t below = 0, found = 0;                                                 \
        for (int64_t i = 0; i < n;) {                                                 \
            int64_t end = n - i < 256 ? n : i + 256;                                  \
            if (found + (end - i) < capacity) {                                       \
                i += VECTOR(x + i, e ? e + i : NULL, end - i, absolute, lo, hi,       \
                            inside, &below, &found);                                  \
                for (; i < end; i++) {                                                \
                    T k = absolute ? ABS(x[i]) : x[i];                                \
                    if (e) k = BLEND(k, e[i]);                                        \
                    below += k < lo;                                                  \
                    inside[found] = k;                                                \
                    found += (k >= lo) & (k <= hi);                                   \
                }                                                                     \
            } else {                                                                  \
                for (; i < end; i++) {                                                \
                    T k = absolute ? ABS(x[i]) : x[i];                                \
                    if (e) k = BLEND(k, e[i]);                                        \
                    below += k < lo;                                                  \
                    if (k >= lo && k <= hi) {                                         \
                        if (found < capacity) inside[found] = k;                      \
                        found++;                                                      \
                    }                                                                 \
                }                                                                     \
            }                                                                         \
        }                                                                             \
        *below_out = below;                                                           \
        return found;                                                                 \
    }                                                                                 \
    static int64_t NAME##_piece(const T *x, const uint8_t *e, int64_t n, int absolute,  \
                                T lo, T hi, T *inside, int64_t capacity, int64_t *below) { \
        /* one copy of the loop per case, each without the other cases' tests */      \
        if (absolute && e) return NAME##_run(x, e, n, 1, lo, hi, inside, capacity, below); \
        if (absolute) return NAME##_run(x, NULL, n, 1, lo, hi, inside, capacity, below);   \
        if (e) return NAME##_run(x, e, n, 0, lo, hi, inside, capacity, below);        \
        return NAME##_run(x, NULL, n, 0, lo, hi, inside, capacity, below);            \
    }                                                                                 \
    /* In `threads` contiguous pieces, each collecting into its own share of      \
       `inside`; the shares are then moved together in index order. Returns more   \
       than `capacity` when the keys inside do not fit (in the whole or in a share). */ \
    int64_t NAME(const T *x, const uint8_t *e, int64_t n, int absolute, T lo, T hi,   \
                 T *inside, int64_t capacity, int64_t *below, int threads) {          \
        int pieces = threads < 1 ? 1 : threads > MAX_PIECES ? MAX_PIECES : threads;   \
        int64_t share = capacity / pieces, below_[MAX_PIECES], found_[MAX_PIECES];    \
        _Pragma("omp parallel for num_threads(pieces) schedule(static, 1)")          \
        for (int p = 0; p < pieces; p++) {                                            \
            int64_t start = n * p / pieces, stop = n * (p + 1) / pieces;              \
            found_[p] = NAME##_piece(x + start, e ? e + start : NULL, stop - start,   \
                                     absolute, lo, hi, inside + share * p, share,     \
                                     &below_[p]);                                     \
        }                                                                             \
        int64_t total_below = 0, total = 0, overflow = 0;                             \
        for (int p = 0; p < pieces; p++) {                                            \
            total_below += below_[p];                                                 \
            overflow |= found_[p] > share;                                            \
            if (!overflow && total != share * p)                                      \
                memmove(inside + total, inside + share * p, (size_t)found_[p] * sizeof(T)); \
            total += found_[p];                                                       \
        }                                                                             \
        *below = total_below;                                                         \
        return overflow && total <= capacity ? capacity + 1 : total;                  \
    }

SCAN(fp_scan_f32, float, fabsf, keep_or_inf_f32, vector_scan_f32)
SCAN(fp_scan_f64, double, fabs, keep_or_inf_f64, vector_scan_f64)

/* ---- survivors: kept = key > v or NaN, eligible; the first `take` keys equal to v pruned ----
 *
 * take < 0 prunes every key equal to v; otherwise the first `take` of them
 * in index order go. Keys as in the scan. Writes 0/1 bytes to `kept`: one
 * vectorized pass (every tie pruned, or every tie kept where some stay),
 * then, where some ties stay, the first `take` ties are pruned, found 64
 * keys at a time from the start (a block without one is one vector
 * comparison), which stops at the last of them.
 */

#define SURVIVORS(NAME, T, ABS)                                                       \
    static inline __attribute__((always_inline)) void NAME##_pass(                    \
        const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute,      \
        T v, int ties_stay, uint8_t *restrict kept, int threads) {                    \
        /* one copy of the loop per case, each without the other cases' tests */     \
        (void)threads; /* without OpenMP */                                           \
        if (absolute && e) {                                                          \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")        \
            for (int64_t i = 0; i < n; i++)                                           \
                kept[i] = (ties_stay ? !(ABS(x[i]) < v) : !(ABS(x[i]) <= v)) & (e[i] != 0); \
        } else if (absolute) {                                                        \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")        \
            for (int64_t i = 0; i < n; i++)                                           \
                kept[i] = ties_stay ? !(ABS(x[i]) < v) : !(ABS(x[i]) <= v);           \
        } else if (e) {                                                               \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")        \
            for (int64_t i = 0; i < n; i++)                                           \
                kept[i] = (ties_stay ? !(x[i] < v) : !(x[i] <= v)) & (e[i] != 0);     \
        } else {                                                                      \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")        \
            for (int64_t i = 0; i < n; i++) kept[i] = ties_stay ? !(x[i] < v) : !(x[i] <= v); \
        }                                                                             \
    }                                                                                 \
    static inline T NAME##_key(const T *x, const uint8_t *e, int64_t i, int absolute) { \
        T k = absolute ? ABS(x[i]) : x[i];                                            \
        return e && !e[i] ? (T)INFINITY : k;                                          \
    }                                                                                 \
    void NAME(const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute, \
              T v, int64_t take, uint8_t *restrict kept, int threads) {               \
        if (take < 0) { /* every tie goes: no order to keep */                        \
            if (absolute) NAME##_pass(x, e, n, 1, v, 0, kept, threads);              \
            else NAME##_pass(x, e, n, 0, v, 0, kept, threads);                        \
            return;                                                                   \
        }                                                                             \
        if (absolute) NAME##_pass(x, e, n, 1, v, 1, kept, threads);                  \
        else NAME##_pass(x, e, n, 0, v, 1, kept, threads);                            \
        for (int64_t i = 0; i < n && take > 0; i += 64) {                             \
            int64_t end = n - i < 64 ? n : i + 64;                                    \
            int hits = 0;                                                             \
            for (int64_t j = i; j < end; j++) hits += NAME##_key(x, e, j, absolute) == v; \
            for (int64_t j = i; hits && j < end && take > 0; j++)                     \
                if (NAME##_key(x, e, j, absolute) == v) {                             \
                    kept[j] = 0; /* (an ineligible key equal to v was written 0 already) */ \
                    take--;                                                           \
                }                                                                     \
        }                                                                             \
    }

SURVIVORS(fp_survivors_f32, float, fabsf)
SURVIVORS(fp_survivors_f64, double, fabs)

/* ---- order codes' top bits: the first round of the selection over shards (_sharded.py) ----
 *
 * The order code of a key (_short_rows.order_codes) is the integer of the
 * key's width whose bits are those of key + 0.0 (so -0.0 codes as 0.0), the
 * lower bits of negatives flipped; every NaN codes one above +inf. Codes
 * order as the keys do. The first round histograms their top 12 bits, the
 * code offset by 2^(bits - 1) (the sign bit flipped), as _sharded.py's
 * bincount of (code >> (bits - 12)) + 2048 does: fp_code_histogram counts
 * the eligible keys per bin, without writing any code; fp_code_collect then
 * writes the codes (int64) and indices of the eligible keys in one bin, and
 * the flags of the keys above that bin (the last pass, but for the bin's). Both
 * run in `pieces` contiguous pieces, split alike, so the histogram's per-piece
 * counts tell each piece where its entries go.
 */

#define CODE_BITS 12
#define CODE_BINS (1 << CODE_BITS)
#define CODE_BLOCK 256
/* Entries counted in the 32-bit sub-histograms before they are added to the 64-bit one. */
#define CODE_FLUSH ((int64_t)1 << 24)

static inline int32_t order_code_f32(float x) {
    float y = x + 0.0f; /* -0.0 -> 0.0 (not folded away: no fast-math) */
    int32_t raw;
    memcpy(&raw, &y, sizeof raw);
    int32_t code = raw ^ (int32_t)((uint32_t)(raw >> 31) >> 1);
    return x != x ? (int32_t)0x7F800001 : code;
}

static inline int64_t order_code_f64(double x) {
    double y = x + 0.0;
    int64_t raw;
    memcpy(&raw, &y, sizeof raw);
    int64_t code = raw ^ (int64_t)((uint64_t)(raw >> 63) >> 1);
    return x != x ? (int64_t)0x7FF0000000000001LL : code;
}

/* The code's bin: its top bits, the sign bit flipped (the code offset to unsigned). */
static inline uint32_t code_bin_f32(int32_t code) { return ((uint32_t)code ^ 0x80000000u) >> (32 - CODE_BITS); }
static inline uint32_t code_bin_f64(int64_t code) {
    return (uint32_t)(((uint64_t)code ^ 0x8000000000000000ULL) >> (64 - CODE_BITS));
}

#define CODE_KERNELS(SUFFIX, T)                                                         \
    /* bins[j] for m keys (m <= CODE_BLOCK): CODE_BINS where not eligible */           \
    static inline void bins_##SUFFIX(const T *restrict x, const uint8_t *restrict e,   \
                                     int64_t m, uint16_t *restrict bins) {             \
        if (e) {                                                                       \
            for (int64_t j = 0; j < m; j++) {                                          \
                uint32_t b = code_bin_##SUFFIX(order_code_##SUFFIX(x[j]));             \
                bins[j] = (uint16_t)(e[j] ? b : CODE_BINS);                            \
            }                                                                          \
        } else {                                                                       \
            for (int64_t j = 0; j < m; j++)                                            \
                bins[j] = (uint16_t)code_bin_##SUFFIX(order_code_##SUFFIX(x[j]));      \
        }                                                                              \
    }                                                                                  \
    static void histogram_piece_##SUFFIX(const T *x, const uint8_t *e, int64_t n,      \
                                         int64_t *restrict out) {                      \
        /* four sub-histograms take turns: a run of one bin waits less on itself */    \
        uint32_t(*sub)[CODE_BINS + 1] = malloc(4 * sizeof *sub);                       \
        uint16_t bins[CODE_BLOCK];                                                     \
        if (!sub) { /* no memory for them: one histogram, the 64-bit one */           \
            for (int64_t i = 0; i < n; i += CODE_BLOCK) {                              \
                int64_t m = n - i < CODE_BLOCK ? n - i : CODE_BLOCK;                   \
                bins_##SUFFIX(x + i, e ? e + i : NULL, m, bins);                       \
                for (int64_t j = 0; j < m; j++) out[bins[j] & (CODE_BINS - 1)] += bins[j] < CODE_BINS; \
            }                                                                          \
            return;                                                                    \
        }                                                                              \
        memset(sub, 0, 4 * sizeof *sub);                                               \
        int64_t since = 0;                                                             \
        for (int64_t i = 0; i < n; i += CODE_BLOCK) {                                  \
            int64_t m = n - i < CODE_BLOCK ? n - i : CODE_BLOCK, j = 0;                \
            bins_##SUFFIX(x + i, e ? e + i : NULL, m, bins);                           \
            for (; j + 4 <= m; j += 4) {                                               \
                sub[0][bins[j]]++;                                                     \
                sub[1][bins[j + 1]]++;                                                 \
                sub[2][bins[j + 2]]++;                                                 \
                sub[3][bins[j + 3]]++;                                                 \
            }                                                                          \
            for (; j < m; j++) sub[0][bins[j]]++;                                      \
            since += m;                                                                \
            if (since >= CODE_FLUSH || i + m >= n) {                                   \
                for (int b = 0; b < CODE_BINS; b++)                                    \
                    out[b] += (int64_t)sub[0][b] + sub[1][b] + sub[2][b] + sub[3][b];  \
                memset(sub, 0, 4 * sizeof *sub);                                       \
                since = 0;                                                             \
            }                                                                          \
        }                                                                              \
        free(sub);                                                                     \
    }                                                                                  \
    /* Adds to hist[p * CODE_BINS + b] the eligible keys of piece p in bin b. */       \
    void fp_code_histogram_##SUFFIX(const T *x, const uint8_t *e, int64_t n,           \
                                    int64_t *hist, int pieces) {                       \
        if (pieces < 1) pieces = 1;                                                    \
        _Pragma("omp parallel for num_threads(pieces) schedule(static, 1)")           \
        for (int p = 0; p < pieces; p++) {                                             \
            int64_t start = n * p / pieces, stop = n * (p + 1) / pieces;               \
            histogram_piece_##SUFFIX(x + start, e ? e + start : NULL, stop - start,    \
                                     hist + (int64_t)p * CODE_BINS);                   \
        }                                                                              \
    }                                                                                  \
    static int64_t collect_piece_##SUFFIX(const T *x, const uint8_t *e, int64_t n,     \
                                          int64_t start, uint32_t bin,                 \
                                          int64_t *restrict codes,                     \
                                          int64_t *restrict where, int64_t room,       \
                                          uint8_t *restrict above) {                   \
        uint16_t bins[CODE_BLOCK];                                                     \
        int64_t found = 0;                                                             \
        for (int64_t i = 0; i < n; i += CODE_BLOCK) {                                  \
            int64_t m = n - i < CODE_BLOCK ? n - i : CODE_BLOCK;                       \
            bins_##SUFFIX(x + i, e ? e + i : NULL, m, bins);                           \
            if (above)                                                                 \
                for (int64_t j = 0; j < m; j++)                                        \
                    above[i + j] = (bins[j] > bin) & (bins[j] < CODE_BINS);            \
            for (int64_t j = 0; j < m; j += 64) {                                      \
                /* a bit per key, set in the bin: one step per key set, none per other */ \
                int64_t w = m - j < 64 ? m - j : 64;                                   \
                uint64_t hits = 0;                                                     \
                for (int64_t k = 0; k < w; k++) hits |= (uint64_t)(bins[j + k] == bin) << k; \
                for (; hits; hits &= hits - 1) {                                       \
                    int64_t at = i + j + __builtin_ctzll(hits);                        \
                    if (found < room) {                                                \
                        codes[found] = order_code_##SUFFIX(x[at]);                     \
                        where[found] = start + at;                                     \
                    }                                                                  \
                    found++;                                                           \
                }                                                                      \
            }                                                                          \
        }                                                                              \
        return found;                                                                  \
    }                                                                                  \
    /* Writes the codes and indices, in index order, of the eligible keys in bin    \
       `bin`: piece p's at offsets[p] up to offsets[p + 1]; and, where `above` is    \
       not NULL, above[i] = 1 for the eligible keys in a higher bin, 0 for the      \
       others (the last pass's flags, but for the keys in `bin`). Returns how many  \
       keys are in `bin`, or -1 where a piece holds another number than its room    \
       (the offsets were not counted on these keys); nothing is written past        \
       offsets[pieces]. */                                                           \
    int64_t fp_code_collect_##SUFFIX(const T *x, const uint8_t *e, int64_t n,         \
                                      int64_t bin, const int64_t *offsets,             \
                                      int64_t *codes, int64_t *where, uint8_t *above,  \
                                      int pieces) {                                    \
        if (pieces < 1 || pieces > MAX_PIECES || bin < 0 || bin >= CODE_BINS) return -1; \
        int64_t found_[MAX_PIECES];                                                    \
        _Pragma("omp parallel for num_threads(pieces) schedule(static, 1)")           \
        for (int p = 0; p < pieces; p++) {                                             \
            int64_t start = n * p / pieces, stop = n * (p + 1) / pieces;               \
            found_[p] = collect_piece_##SUFFIX(x + start, e ? e + start : NULL,        \
                                               stop - start, start, (uint32_t)bin,     \
                                               codes + offsets[p], where + offsets[p], \
                                               offsets[p + 1] - offsets[p],            \
                                               above ? above + start : NULL);          \
        }                                                                              \
        for (int p = 0; p < pieces; p++)                                               \
            if (found_[p] != offsets[p + 1] - offsets[p]) return -1;                   \
        return offsets[pieces] - offsets[0];                                           \
    }

CODE_KERNELS(f32, float)
CODE_KERNELS(f64, double)

/* ---- block norms: each tile's L2 norm, with torch.linalg.vector_norm's arithmetic ----
 *
 * For the Block spec (funcprune/_specs/_shape_kernels.py): blocks are ranked by
 * the norms vector_norm gives, so these are computed as torch's generic CPU
 * reduction computes them (one accumulator, the tile's entries in row-major
 * order: acc + v * v, or fma(v, v, acc) where `fused`, as torch's compiler
 * contracted it); funcprune/_select/_blocks.py finds which, once per
 * process and dtype, on a probe (where neither matches, torch computes the
 * norms). x is rows of `width` entries; tile (p, c), for p < P and c < C, has
 * rows i < a, the b entries of row p * a + i from c * b on. The norm is the
 * correctly rounded square root of the sum, in T (the caller rounds it to a
 * narrower dtype). The sums of a row of tiles go along together, a row of
 * every tile at a time, each tile's in its own order (vectorized across
 * tiles where the compiler can: a constant b lets it interleave the loads);
 * rows of tiles are shared among the threads, a few at a time.
 */

#define BLOCK_NORMS(NAME, T, FMA, SQRT)                                                 \
    static inline __attribute__((always_inline)) void NAME##_tiles(                      \
        const T *restrict x, int64_t width, int64_t a, int64_t C, int64_t b, int fused,  \
        T *restrict o) {                                                                 \
        for (int64_t c = 0; c < C; c++) o[c] = 0;                                        \
        for (int64_t i = 0; i < a; i++) {                                                \
            const T *restrict r = x + i * width;                                         \
            for (int64_t c = 0; c < C; c++) {                                            \
                T acc = o[c];                                                            \
                for (int64_t j = 0; j < b; j++) {                                        \
                    T v = r[c * b + j];                                                  \
                    acc = fused ? FMA(v, v, acc) : acc + v * v;                          \
                }                                                                        \
                o[c] = acc;                                                              \
            }                                                                            \
        }                                                                                \
        for (int64_t c = 0; c < C; c++) o[c] = SQRT(o[c]);                               \
    }                                                                                    \
    static void NAME##_row(const T *x, int64_t width, int64_t a, int64_t C, int64_t b,   \
                           int fused, T *o) {                                            \
        if (fused) {                                                                     \
            if (b == 4) NAME##_tiles(x, width, a, C, 4, 1, o);                           \
            else if (b == 8) NAME##_tiles(x, width, a, C, 8, 1, o);                      \
            else if (b == 2) NAME##_tiles(x, width, a, C, 2, 1, o);                      \
            else if (b == 16) NAME##_tiles(x, width, a, C, 16, 1, o);                    \
            else if (b == 1) NAME##_tiles(x, width, a, C, 1, 1, o);                      \
            else NAME##_tiles(x, width, a, C, b, 1, o);                                  \
        } else {                                                                         \
            if (b == 4) NAME##_tiles(x, width, a, C, 4, 0, o);                           \
            else if (b == 8) NAME##_tiles(x, width, a, C, 8, 0, o);                      \
            else if (b == 2) NAME##_tiles(x, width, a, C, 2, 0, o);                      \
            else if (b == 16) NAME##_tiles(x, width, a, C, 16, 0, o);                    \
            else if (b == 1) NAME##_tiles(x, width, a, C, 1, 0, o);                      \
            else NAME##_tiles(x, width, a, C, b, 0, o);                                  \
        }                                                                                \
    }                                                                                    \
    void NAME(const T *x, int64_t P, int64_t a, int64_t C, int64_t b, int64_t width,     \
              int fused, T *out, int threads) {                                          \
        (void)threads; /* without OpenMP */                                              \
        /* dynamic: a thread slowed down (a busy core) leaves its rows to the others */ \
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 8)")           \
        for (int64_t p = 0; p < P; p++) NAME##_row(x + p * a * width, width, a, C, b, fused, out + p * C); \
    }

BLOCK_NORMS(fp_block_norms_f32, float, fmaf, sqrtf)
BLOCK_NORMS(fp_block_norms_f64, double, fma, sqrt)

/* ---- per-row selection: in every row, the k[r] lowest eligible keys pruned ----
 *
 * For funcprune/_select/_rows.py: many long groups at once (PerSlice), and
 * many tensors at once, each a row of its own length (a plan's per-tensor
 * rules: fp_ragged_keep_*). Rows of n keys, contiguous; key(i) = |x[i]|
 * (absolute) or x[i]; an entry whose eligible byte is 0 (eligible may be
 * NULL: all eligible) is neither pruned nor kept. Keys are compared by their
 * order codes (as above: -0.0 as 0.0, NaN one above +inf; an entry not
 * eligible codes as the largest integer), so the selection is exact. Per
 * row, as the bracket path does for one group: a strided sample's order
 * statistics bracket the k-th code (256 keys; 1024, 4096 or 16384 in longer
 * rows, with a wider margin: fewer keys inside); one pass counts the codes below
 * the bracket and collects those inside; a select over those (histograms of
 * their codes' range, narrowed round by round) finds the k-th code t (over
 * every eligible code where the sample misled); one pass writes the flags
 * (code above t), and a last one, only where some codes equal to t stay,
 * keeps those after the first (k - codes below t) in index order. Rows from
 * ROW_FUSE_MIN keys are read once instead: the collecting pass also writes
 * every flag the bracket decides (code above it: kept; below: pruned) and
 * the indices of the codes inside, whose flags are then set once t is known
 * (the first k - codes below t equal to t, in index order, pruned).
 * k[r] is capped to [0, eligible]. Rows are shared among the threads (a few at
 * a time, as each thread is free), each row one thread's. Returns -1 where
 * scratch memory could not be had (the caller then runs torch).
 */

#define ROW_SAMPLE 256
#define ROW_SAMPLE_MAX 16384
#define ROW_SELECT_MIN 1024 /* rows shorter than this: a select over all their codes */
#define ROW_RUN 16           /* the sample: runs of this many entries, spread evenly (few cache lines) */
#define ROW_FUSE_MIN (1 << 15) /* rows this long and longer: one read (flags and indices written on the way) */
#define SAMPLE_AT(j, n, s) ((2 * ((j) / ROW_RUN) + 1) * ((n) - ROW_RUN) / (2 * (s) / ROW_RUN) + (j) % ROW_RUN)
#define ROW_SORT_MAX 32

/* The sample's size in a row of n keys (a power of two, a multiple of ROW_RUN): from 65536
 * keys, n / 256 to n / 64 of them, at most ROW_SAMPLE_MAX. */
static inline int64_t row_sample(int64_t n) {
    if (n < ((int64_t)1 << 16)) return ROW_SAMPLE;
    if (n < ((int64_t)1 << 18)) return 1024;
    return n < ((int64_t)1 << 20) ? 4096 : ROW_SAMPLE_MAX;
}

/* Byte i of the result is bit i of b (0 or 1). */
static inline uint64_t spread_bits(unsigned b) {
    uint64_t set = ((uint64_t)b * 0x0101010101010101ull) & 0x8040201008040201ull;
    return ((set + 0x7F7F7F7F7F7F7F7Full) >> 7) & 0x0101010101010101ull;
}

/* Order codes without branches (vectorizable): as order_code_*, 0x7F.. the NaN code. */
static inline int32_t row_code_f32(float v, int absolute) {
    uint32_t raw;
    memcpy(&raw, &v, sizeof raw);
    uint32_t magnitude = raw & 0x7FFFFFFFu;
    raw = absolute || magnitude == 0 ? magnitude : raw; /* |v|; -0.0 as 0.0 */
    int32_t s = (int32_t)raw, code = s ^ (int32_t)((uint32_t)(s >> 31) >> 1);
    return magnitude > 0x7F800000u ? (int32_t)0x7F800001 : code;
}

static inline int64_t row_code_f64(double v, int absolute) {
    uint64_t raw;
    memcpy(&raw, &v, sizeof raw);
    uint64_t magnitude = raw & 0x7FFFFFFFFFFFFFFFull;
    raw = absolute || magnitude == 0 ? magnitude : raw;
    int64_t s = (int64_t)raw, code = s ^ (int64_t)((uint64_t)(s >> 63) >> 1);
    return magnitude > 0x7FF0000000000000ull ? (int64_t)0x7FF0000000000001LL : code;
}

/* The r-th smallest (0-based) of a[0..n) (0 <= r < n), all of them in [lo, hi]:
 * a 256-bin histogram of the range, narrowed to the bin holding it, until a few
 * codes or one value are left, then sorted. Also how many of a are below it
 * (*under) and equal to it (*same). a is overwritten. */
#define RANGE_SELECT(NAME, C, U)                                                        \
    static C NAME(C *restrict a, int64_t n, int64_t r, C lo, C hi, int64_t *under,      \
                  int64_t *same) {                                                       \
        uint32_t hist[256];                                                              \
        int64_t below = 0;                                                               \
        while (n > ROW_SORT_MAX && lo < hi) {                                            \
            U span = (U)hi - (U)lo;                                                      \
            int shift = 0;                                                               \
            while ((span >> shift) >= 256) shift++;                                      \
            memset(hist, 0, sizeof hist);                                                \
            for (int64_t j = 0; j < n; j++) hist[((U)a[j] - (U)lo) >> shift]++;          \
            uint32_t bin = 0;                                                            \
            int64_t cum = 0;                                                             \
            while (cum + hist[bin] <= r) cum += hist[bin++];                             \
            below += cum;                                                                \
            r -= cum;                                                                    \
            int64_t f = 0;                                                               \
            for (int64_t j = 0; j < n; j++) {                                            \
                C v = a[j];                                                              \
                a[f] = v;                                                                \
                f += (((U)v - (U)lo) >> shift) == bin;                                   \
            }                                                                            \
            n = f;                                                                       \
            C base = (C)((U)lo + ((U)bin << shift));                                     \
            U room = ((U)1 << shift) - 1;                                                \
            if (room < (U)hi - (U)base) hi = (C)((U)base + room);                        \
            lo = base;                                                                   \
        }                                                                                \
        if (lo == hi) { /* all equal */                                                 \
            *under = below;                                                              \
            *same = n;                                                                   \
            return lo;                                                                   \
        }                                                                                \
        for (int64_t i = 1; i < n; i++) {                                                \
            C v = a[i];                                                                  \
            int64_t h = i;                                                               \
            for (; h > 0 && a[h - 1] > v; h--) a[h] = a[h - 1];                          \
            a[h] = v;                                                                    \
        }                                                                                \
        C t = a[r];                                                                      \
        int64_t first = r, last = r;                                                     \
        while (first > 0 && a[first - 1] == t) first--;                                  \
        while (last + 1 < n && a[last + 1] == t) last++;                                 \
        *under = below + first;                                                          \
        *same = last - first + 1;                                                        \
        return t;                                                                        \
    }

RANGE_SELECT(range_select_i32, int32_t, uint32_t)
RANGE_SELECT(range_select_i64, int64_t, uint64_t)

/* The bracket's pass over float keys, 8 at a time where the compiler targets
 * AVX2: adds the count of codes below lo to *below, writes the codes in
 * [lo, hi] at inside + *found (8 more entries' room is needed) and moves
 * *found on; returns how many keys it looked at (the caller does the rest).
 * Elsewhere it looks at none. The fused pass (vector_fused_*) also writes the
 * indices of the codes inside at where + *found (as many, the same room) and
 * a flag per key: 1 where its code is above hi and it is eligible, else 0. */
#if defined(__AVX2__)
#include <immintrin.h>

static inline __attribute__((always_inline)) __m256i codes8_f32(const float *x, const uint8_t *e,
                                                                int absolute) {
    __m256i raw = _mm256_loadu_si256((const __m256i *)x);
    __m256i magnitude = _mm256_and_si256(raw, _mm256_set1_epi32(0x7FFFFFFF));
    __m256i zero = _mm256_setzero_si256();
    if (absolute) raw = magnitude;
    else raw = _mm256_andnot_si256(_mm256_cmpeq_epi32(magnitude, zero), raw); /* -0.0 as 0.0 */
    __m256i code = _mm256_xor_si256(raw, _mm256_srli_epi32(_mm256_srai_epi32(raw, 31), 1));
    __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7F800001), nan);
    if (e) {
        __m256i flags = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e));
        code = _mm256_blendv_epi8(code, _mm256_set1_epi32(INT32_MAX), _mm256_cmpeq_epi32(flags, zero));
    }
    return code;
}

static inline __attribute__((always_inline)) int64_t vector_bracket_f32(
    const float *x, const uint8_t *e, int64_t n, int absolute, int32_t lo_, int32_t hi_,
    int32_t *inside, int64_t *below, int64_t *found, const int32_t (*pack)[8]) {
    const __m256i lo = _mm256_set1_epi32(lo_), hi = _mm256_set1_epi32(hi_);
    __m256i count = _mm256_setzero_si256();
    int64_t i = 0, f = *found;
    for (; i + 8 <= n; i += 8) {
        __m256i c = codes8_f32(x + i, e ? e + i : NULL, absolute);
        __m256i under = _mm256_cmpgt_epi32(lo, c), over = _mm256_cmpgt_epi32(c, hi);
        count = _mm256_sub_epi32(count, under);
        int in = ~_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(under, over))) & 0xFF;
        __m256i packed = _mm256_permutevar8x32_epi32(c, _mm256_loadu_si256((const __m256i *)pack[in]));
        _mm256_storeu_si256((__m256i *)(inside + f), packed);
        f += __builtin_popcount((unsigned)in);
    }
    *below += lanes_sum_epi32(count);
    *found = f;
    return i;
}

/* n < 2**31: the indices and each lane's count below fit in 32 bits. */
static inline __attribute__((always_inline)) int64_t vector_fused_f32(
    const float *x, const uint8_t *e, int64_t n, int absolute, int32_t lo_, int32_t hi_,
    int32_t *inside, int32_t *where, uint8_t *kept, int64_t *below, int64_t *found,
    const int32_t (*pack)[8]) {
    const __m256i lo = _mm256_set1_epi32(lo_), hi = _mm256_set1_epi32(hi_);
    const __m256i none = _mm256_set1_epi32(INT32_MAX), eight = _mm256_set1_epi32(8);
    __m256i count = _mm256_setzero_si256(), index = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t i = 0, f = *found;
    for (; i + 8 <= n; i += 8) {
        __m256i c = codes8_f32(x + i, e ? e + i : NULL, absolute);
        __m256i under = _mm256_cmpgt_epi32(lo, c), over = _mm256_cmpgt_epi32(c, hi);
        count = _mm256_sub_epi32(count, under);
        int in = ~_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(under, over))) & 0xFF;
        __m256i order = _mm256_loadu_si256((const __m256i *)pack[in]);
        _mm256_storeu_si256((__m256i *)(inside + f), _mm256_permutevar8x32_epi32(c, order));
        _mm256_storeu_si256((__m256i *)(where + f), _mm256_permutevar8x32_epi32(index, order));
        f += __builtin_popcount((unsigned)in);
        unsigned up = (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(over));
        if (e) /* not eligible: coded INT32_MAX, above hi, never kept */
            up &= ~(unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(c, none)));
        uint64_t bytes = spread_bits(up);
        memcpy(kept + i, &bytes, sizeof bytes);
        index = _mm256_add_epi32(index, eight);
    }
    *below += lanes_sum_epi32(count);
    *found = f;
    return i;
}
#else
static inline int64_t vector_bracket_f32(const float *x, const uint8_t *e, int64_t n, int absolute,
                                         int32_t lo, int32_t hi, int32_t *inside, int64_t *below,
                                         int64_t *found, const int32_t (*pack)[8]) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)inside, (void)below,
        (void)found, (void)pack;
    return 0;
}

static inline int64_t vector_fused_f32(const float *x, const uint8_t *e, int64_t n, int absolute,
                                       int32_t lo, int32_t hi, int32_t *inside, int32_t *where,
                                       uint8_t *kept, int64_t *below, int64_t *found,
                                       const int32_t (*pack)[8]) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)inside, (void)where,
        (void)kept, (void)below, (void)found, (void)pack;
    return 0;
}
#endif

static inline int64_t vector_bracket_f64(const double *x, const uint8_t *e, int64_t n, int absolute,
                                         int64_t lo, int64_t hi, int64_t *inside, int64_t *below,
                                         int64_t *found, const int32_t (*pack)[8]) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)inside, (void)below,
        (void)found, (void)pack;
    return 0;
}

static inline int64_t vector_fused_f64(const double *x, const uint8_t *e, int64_t n, int absolute,
                                       int64_t lo, int64_t hi, int64_t *inside, int32_t *where,
                                       uint8_t *kept, int64_t *below, int64_t *found,
                                       const int32_t (*pack)[8]) {
    (void)x, (void)e, (void)n, (void)absolute, (void)lo, (void)hi, (void)inside, (void)where,
        (void)kept, (void)below, (void)found, (void)pack;
    return 0;
}

/* A thread's scratch: for a row of up to `longest` keys, room for n + 8 codes
 * (and, from ROW_FUSE_MIN keys, as many indices and a copy of the codes), the
 * sample and a copy of it. */
typedef struct {
    void *cand, *work, *sample;
    int32_t *where;
} RowScratch;

static int row_scratch(RowScratch *s, int64_t longest, size_t width) {
    size_t room = (size_t)longest + 8;
    int fuse = longest >= ROW_FUSE_MIN;
    s->cand = malloc(room * width);
    s->work = fuse ? malloc(room * width) : NULL;
    s->where = fuse ? malloc(room * sizeof(int32_t)) : NULL;
    s->sample = malloc(2 * ROW_SAMPLE_MAX * width);
    return s->cand && s->sample && (!fuse || (s->work && s->where));
}

static void row_scratch_free(RowScratch *s) {
    free(s->cand);
    free(s->work);
    free(s->where);
    free(s->sample);
}

#define ROWS_KEEP(NAME, RAGGED, T, C, CODE, CMAX, SELECT, VECTOR, FUSED)                 \
    static inline __attribute__((always_inline)) C NAME##_code(const T *x,               \
        const uint8_t *e, int64_t i, int absolute) {                                     \
        C c = CODE(x[i], absolute);                                                      \
        return !e || e[i] ? c : CMAX;                                                    \
    }                                                                                    \
    /* The codes likely to hold the kk-th (1 <= kk < eligible), from a sample of s. */  \
    static inline __attribute__((always_inline)) void NAME##_bracket(                    \
        const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute,         \
        int64_t kk, C *restrict sample, C *lo, C *hi) {                                  \
        int64_t s = row_sample(n), under, same;                                          \
        C *copy = sample + ROW_SAMPLE_MAX, least = CMAX, most = -CMAX - 1;               \
        for (int64_t j = 0; j < s; j += ROW_RUN) { /* every run's lines asked for at once */ \
            int64_t at = SAMPLE_AT(j, n, s);                                             \
            __builtin_prefetch(x + at);                                                  \
            __builtin_prefetch(x + at + ROW_RUN - 1);                                    \
            if (e) __builtin_prefetch(e + at);                                           \
        }                                                                                \
        for (int64_t j = 0; j < s; j += ROW_RUN) {                                       \
            int64_t at = SAMPLE_AT(j, n, s);                                             \
            for (int64_t l = 0; l < ROW_RUN; l++) {                                      \
                C c = NAME##_code(x, e, at + l, absolute);                               \
                sample[j + l] = c;                                                       \
                least = c < least ? c : least;                                           \
                most = c > most ? c : most;                                              \
            }                                                                            \
        }                                                                                \
        double p = (double)kk / (double)n, q = p * (double)s;                            \
        double spread = s == ROW_SAMPLE ? 2.5 : 3.5; /* standard deviations */          \
        double margin = spread * sqrt((double)s * p * (1 - p)) + 3;                      \
        int64_t lo_r = (int64_t)floor(q - margin), hi_r = (int64_t)ceil(q + margin);     \
        if (lo_r >= 0) {                                                                 \
            memcpy(copy, sample, (size_t)s * sizeof(C));                                 \
            *lo = SELECT(copy, s, lo_r, least, most, &under, &same);                     \
        }                                                                                \
        if (hi_r < s) {                                                                  \
            memcpy(copy, sample, (size_t)s * sizeof(C));                                 \
            C h = SELECT(copy, s, hi_r, least, most, &under, &same);                     \
            *hi = h < CMAX - 1 ? h : CMAX - 1;                                           \
        }                                                                                \
    }                                                                                    \
    /* One row read once (n < 2**31): 1 where done, 0 where the sample misled. Every    \
     * flag outside the bracket is final once written; those inside are set once the   \
     * cut t is found (the codes and indices collected, in index order). */            \
    static inline __attribute__((always_inline)) int NAME##_fused(                       \
        const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute,         \
        int64_t kk, C lo, C hi, const RowScratch *sc, uint8_t *restrict kept) {          \
        C *restrict cand = sc->cand, *restrict work = sc->work;                          \
        int32_t *restrict where = sc->where;                                             \
        int64_t below = 0, found = 0, under, same;                                       \
        int64_t i = FUSED(x, e, n, absolute, lo, hi, cand, where, kept, &below, &found,  \
                          LANE_PACK);                                                    \
        for (; i < n; i++) {                                                             \
            C c = NAME##_code(x, e, i, absolute);                                        \
            below += c < lo;                                                             \
            cand[found] = c;                                                             \
            where[found] = (int32_t)i;                                                   \
            found += (c >= lo) & (c <= hi);                                              \
            kept[i] = (uint8_t)(c > hi) & (uint8_t)(c != CMAX);                          \
        }                                                                                \
        if (!(below < kk && kk <= below + found)) return 0;                              \
        memcpy(work, cand, (size_t)found * sizeof(C));                                   \
        C t = SELECT(work, found, kk - 1 - below, lo, hi, &under, &same);                \
        int64_t ties = kk - below - under; /* the first `ties` codes equal to t go */   \
        for (int64_t j = 0; j < found; j++) {                                            \
            C c = cand[j];                                                               \
            kept[where[j]] = c == t ? (uint8_t)(ties-- <= 0) : (uint8_t)(c > t);         \
        }                                                                                \
        return 1;                                                                        \
    }                                                                                    \
    /* One row, its kk (1 <= kk < m, the eligible count). */                             \
    static inline __attribute__((always_inline)) void NAME##_run(                        \
        const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute,         \
        int64_t kk, const RowScratch *sc, uint8_t *restrict kept) {                      \
        C *restrict cand = sc->cand;                                                     \
        int64_t below = 0, found = 0, rank = kk - 1, under, same;                        \
        C lo = -CMAX - 1, hi = CMAX - 1;                                                 \
        if (n >= ROW_SELECT_MIN) {                                                       \
            NAME##_bracket(x, e, n, absolute, kk, sc->sample, &lo, &hi);                 \
            if (n >= ROW_FUSE_MIN && n <= INT32_MAX) {                                   \
                if (NAME##_fused(x, e, n, absolute, kk, lo, hi, sc, kept)) return;       \
            } else {                                                                     \
                int64_t i = VECTOR(x, e, n, absolute, lo, hi, cand, &below, &found,      \
                                   LANE_PACK);                                           \
                for (; i < n; i++) {                                                     \
                    C c = NAME##_code(x, e, i, absolute);                                \
                    below += c < lo;                                                     \
                    cand[found] = c;                                                     \
                    found += (c >= lo) & (c <= hi);                                      \
                }                                                                        \
            }                                                                            \
            if (below < kk && kk <= below + found) {                                     \
                rank = kk - 1 - below;                                                   \
            } else { /* the sample misled: every eligible code */                       \
                below = found = 0;                                                       \
                lo = -CMAX - 1;                                                          \
                hi = CMAX - 1;                                                           \
            }                                                                            \
        }                                                                                \
        if (found == 0) {                                                                \
            for (int64_t i = 0; i < n; i++) {                                            \
                cand[found] = NAME##_code(x, e, i, absolute);                            \
                found += !e || e[i] != 0;                                                \
            }                                                                            \
            if (rank >= found) rank = found > 0 ? found - 1 : 0; /* (m was not exact) */ \
        }                                                                                \
        C t = SELECT(cand, found, rank, lo, hi, &under, &same);                          \
        int64_t ties = kk - below - under; /* of the `same` codes equal to t */         \
        for (int64_t i = 0; i < n; i++)                                                  \
            kept[i] = (uint8_t)(NAME##_code(x, e, i, absolute) > t) & (uint8_t)(!e || e[i] != 0); \
        if (same > ties) /* the first `ties` codes equal to t go, the others stay */    \
            for (int64_t i = 0; i < n; i++)                                              \
                if (NAME##_code(x, e, i, absolute) == t && ties-- <= 0) kept[i] = 1;      \
    }                                                                                    \
    /* m: the row's eligible count, or -1 (counted here). */                            \
    static void NAME##_row(const T *x, const uint8_t *e, int64_t n, int absolute,        \
                           int64_t kk, int64_t m, const RowScratch *sc, uint8_t *kept) { \
        if (m < 0) {                                                                     \
            m = n;                                                                       \
            if (e) {                                                                     \
                m = 0;                                                                   \
                for (int64_t i = 0; i < n; i++) m += e[i] != 0;                          \
            }                                                                            \
        }                                                                                \
        kk = kk < 0 ? 0 : kk > m ? m : kk;                                               \
        if (kk == 0) {                                                                   \
            for (int64_t i = 0; i < n; i++) kept[i] = !e || e[i] != 0;                   \
        } else if (kk == m) {                                                            \
            memset(kept, 0, (size_t)n);                                                  \
        } else if (e) { /* one copy of the row's code per case, each without the other's tests */ \
            if (absolute) NAME##_run(x, e, n, 1, kk, sc, kept);                          \
            else NAME##_run(x, e, n, 0, kk, sc, kept);                                   \
        } else {                                                                         \
            if (absolute) NAME##_run(x, NULL, n, 1, kk, sc, kept);                       \
            else NAME##_run(x, NULL, n, 0, kk, sc, kept);                                \
        }                                                                                \
    }                                                                                    \
    int NAME(const T *x, const uint8_t *e, int64_t rows, int64_t n, int absolute,       \
             const int64_t *k, uint8_t *kept, int threads) {                             \
        int failed = 0;                                                                  \
        if (rows <= 0 || n <= 0) return 0;                                               \
        (void)threads; /* without OpenMP */                                              \
        _Pragma("omp parallel num_threads(threads)")                                    \
        {                                                                                \
            RowScratch sc;                                                               \
            int ready = row_scratch(&sc, n, sizeof(C));                                  \
            int64_t s = row_sample(n);                                                   \
            _Pragma("omp for schedule(dynamic, 8)") /* as the block norms' */          \
            for (int64_t r = 0; r < rows; r++) {                                         \
                if (!ready) {                                                            \
                    _Pragma("omp atomic write")                                         \
                    failed = 1;                                                          \
                    continue;                                                            \
                }                                                                        \
                if (n >= ROW_SELECT_MIN && r + 1 < rows) /* the next row's sample, meanwhile */ \
                    for (int64_t j = 0; j < s; j += ROW_RUN) {                           \
                        __builtin_prefetch(x + (r + 1) * n + SAMPLE_AT(j, n, s));        \
                        if (e) __builtin_prefetch(e + (r + 1) * n + SAMPLE_AT(j, n, s)); \
                    }                                                                    \
                NAME##_row(x + r * n, e ? e + r * n : NULL, n, absolute, k[r], -1, &sc,  \
                           kept + r * n);                                                \
            }                                                                            \
            row_scratch_free(&sc);                                                       \
        }                                                                                \
        return failed ? -1 : 0;                                                          \
    }                                                                                    \
    /* Rows of their own lengths, anywhere: row r is n[r] keys at x[r] (flags at e[r],  \
     * or 0: all eligible; m[r] of them eligible, or -1: counted here), its flags       \
     * written at kept[r]. Rows go to the threads one at a time, in the given order    \
     * (the caller puts the longest first). */                                          \
    int RAGGED(const int64_t *x, const int64_t *e, const int64_t *n, const int64_t *m,  \
               int64_t rows, int absolute, const int64_t *k, const int64_t *kept,        \
               int threads) {                                                            \
        int failed = 0;                                                                  \
        int64_t longest = 0;                                                             \
        for (int64_t r = 0; r < rows; r++) longest = n[r] > longest ? n[r] : longest;    \
        if (rows <= 0 || longest <= 0) return 0;                                         \
        (void)threads; /* without OpenMP */                                              \
        _Pragma("omp parallel num_threads(threads)")                                    \
        {                                                                                \
            RowScratch sc;                                                               \
            int ready = row_scratch(&sc, longest, sizeof(C));                            \
            _Pragma("omp for schedule(dynamic, 1)")                                     \
            for (int64_t r = 0; r < rows; r++) {                                         \
                if (!ready) {                                                            \
                    _Pragma("omp atomic write")                                         \
                    failed = 1;                                                          \
                    continue;                                                            \
                }                                                                        \
                if (n[r] > 0)                                                            \
                    NAME##_row((const T *)(intptr_t)x[r], (const uint8_t *)(intptr_t)e[r], n[r], \
                               absolute, k[r], m[r], &sc, (uint8_t *)(intptr_t)kept[r]); \
            }                                                                            \
            row_scratch_free(&sc);                                                       \
        }                                                                                \
        return failed ? -1 : 0;                                                          \
    }

ROWS_KEEP(fp_rows_keep_f32, fp_ragged_keep_f32, float, int32_t, row_code_f32, INT32_MAX, range_select_i32,
          vector_bracket_f32, vector_fused_f32)
ROWS_KEEP(fp_rows_keep_f64, fp_ragged_keep_f64, double, int64_t, row_code_f64, INT64_MAX, range_select_i64,
          vector_bracket_f64, vector_fused_f64)

/* ---- per-row counts of a bool mask: how many of each row's n flags are set ----
 *
 * For funcprune/_select (eligible_per_group): the per-row counts that resolve
 * a per-slice amount against an earlier mask, in one pass (a torch sum over
 * the last dim of bool costs several nanoseconds a flag). Rows are split
 * among the threads.
 */

void fp_row_counts(const uint8_t *e, int64_t rows, int64_t n, int64_t *out, int threads) {
    (void)threads; /* without OpenMP */
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 8)")
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = e + r * n;
        int64_t total = 0;
        for (int64_t i = 0; i < n;) { /* 32-bit partial sums: vectorized widening adds */
            int64_t end = n - i < ((int64_t)1 << 24) ? n : i + ((int64_t)1 << 24);
            uint32_t part = 0;
            for (; i < end; i++) part += row[i] != 0;
            total += part;
        }
        out[r] = total;
    }
}

/* ---- N:M: in each group of m entries along a dim, the n of largest |x| kept ----
 *
 * For the NM spec (funcprune/_select/_n_m.py). The tensor is viewed as
 * (units, m, inner): a group is m entries `inner` apart, m consecutive ones
 * where inner = 1 (N:M along the last dim). An entry's key is |x|, compared
 * by its order code (the bits with the sign cleared, every NaN one code
 * above +inf, so that -0.0 ties 0.0 and NaNs tie each other) plus one; an
 * entry that is not eligible codes 0. Entry t of a group is kept where it is
 * eligible and fewer than n entries of its group beat it, s beating t where
 * its code is greater, or equal with s > t. That is _select's rule: the
 * max(0, eligible - n) lowest eligible keys of a group go, ties to the lower
 * index first (a code 0 never beats an eligible entry). One read of x (and
 * e), one byte written per entry; each entry is compared with the m - 1
 * others of its group (m at most NM_MAX_M), in loops over contiguous codes
 * that the compiler vectorizes whatever m is:
 *
 * - inner = 1: a run of whole groups is coded into a buffer; each entry is
 *   compared with the one r further on in its group (1 <= r < m), wrapping
 *   around: at i + r, or at i + r - m where that passes the group's end
 *   (both read, one chosen by the entry's place in its group). For m = 2
 *   and 4 one pass does every r; for other m, one pass per r adds up the
 *   counts;
 * - inner > 1: NM_TILE groups side by side (consecutive columns) are coded
 *   row by row and ranked column-wise: no transposed copy.
 */

#define NM_MAX_M 64
/* Entries coded and ranked at a time (inner = 1: whole groups, NM_RUN / m of them). */
#define NM_RUN 256
/* Groups side by side (inner > 1). */
#define NM_TILE 64
/* Runs per work item (inner = 1). */
#define NM_RUNS 16

/* Codes are signed (the compares vectorize natively), every one below the sign bit. */
static inline int32_t nm_code_f32(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= 0x7FFFFFFFu;
    return (int32_t)(bits < 0x7F800001u ? bits : 0x7F800001u) + 1;
}

static inline int64_t nm_code_f64(double x) {
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    bits &= 0x7FFFFFFFFFFFFFFFull;
    return (int64_t)(bits < 0x7FF0000000000001ull ? bits : 0x7FF0000000000001ull) + 1;
}

/* m = 4 in float32, 8 entries (two groups) at a time in registers: each entry
 * is compared with the 3 others of its group by rotating the lanes within
 * each group of four, no buffer. Returns how many entries it ranked (a
 * multiple of 8; the caller ranks the rest); none where the compiler lacks
 * __builtin_shufflevector (GCC before 12). */
#if defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector)
#define NM_SHUFFLE 1
#endif
#endif

#ifdef NM_SHUFFLE
typedef int32_t nm_lanes __attribute__((vector_size(32)));
typedef uint8_t nm_bytes8 __attribute__((vector_size(8)));
typedef uint8_t nm_bytes16 __attribute__((vector_size(16)));

/* Eight 0/1 lanes written as eight bytes, narrowed in registers: AVX2 has no narrowing store
 * (AVX-512's vpmovdb), and the compiler's own narrowing extracts each lane there. */
#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
static inline void nm_store_flags8(uint8_t *out, const nm_lanes *flags) {
    __m256i k;
    memcpy(&k, flags, sizeof k);
    __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(k), _mm256_extracti128_si256(k, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi16(words, words));
}
#else
static inline void nm_store_flags8(uint8_t *out, const nm_lanes *flags) {
    nm_bytes8 bytes = __builtin_convertvector(*flags, nm_bytes8); /* 0 or 1, narrowed in registers */
    memcpy(out, &bytes, sizeof bytes);
}
#endif

static int64_t nm_groups_of_4_f32(const float *restrict x, const uint8_t *restrict e, int64_t len, int n,
                                  uint8_t *restrict kept) {
    /* round r: -1 in the lanes whose entry r further on (wrapping) has the higher index */
    const nm_lanes later1 = {-1, -1, -1, 0, -1, -1, -1, 0}, later2 = {-1, -1, 0, 0, -1, -1, 0, 0},
                   later3 = {-1, 0, 0, 0, -1, 0, 0, 0};
    const nm_lanes magnitude = {0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF,
                                0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF};
    const nm_lanes inf = {0x7F800000, 0x7F800000, 0x7F800000, 0x7F800000,
                          0x7F800000, 0x7F800000, 0x7F800000, 0x7F800000};
    const nm_lanes one = {1, 1, 1, 1, 1, 1, 1, 1}, zero = {0, 0, 0, 0, 0, 0, 0, 0};
    const nm_lanes least = zero - n; /* minus the count of entries beating one it keeps, above this */
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        nm_lanes c;
        memcpy(&c, x + i, sizeof c);
        c &= magnitude;
        c = ((c & ~(c > inf)) | ((inf + one) & (c > inf))) + one; /* every NaN one above +inf */
        if (e) {
            const uint8_t *f = e + i;
            nm_lanes eligible = {f[0], f[1], f[2], f[3], f[4], f[5], f[6], f[7]};
            c &= eligible != zero;
        }
        nm_lanes r1 = __builtin_shufflevector(c, c, 1, 2, 3, 0, 5, 6, 7, 4);
        nm_lanes r2 = __builtin_shufflevector(c, c, 2, 3, 0, 1, 6, 7, 4, 5);
        nm_lanes r3 = __builtin_shufflevector(c, c, 3, 0, 1, 2, 7, 4, 5, 6);
        nm_lanes minus_beaten = ((r1 > c) | ((r1 == c) & later1)) + ((r2 > c) | ((r2 == c) & later2)) +
                                ((r3 > c) | ((r3 == c) & later3));
        nm_lanes keep = (minus_beaten > least) & (c != zero);
        keep &= one;
        nm_store_flags8(kept + i, &keep);
    }
    return i;
}
#else
static int64_t nm_groups_of_4_f32(const float *x, const uint8_t *e, int64_t len, int n, uint8_t *kept) {
    (void)x, (void)e, (void)len, (void)n, (void)kept;
    return 0;
}
#endif

static int64_t nm_groups_of_4_f64(const double *x, const uint8_t *e, int64_t len, int n, uint8_t *kept) {
    (void)x, (void)e, (void)len, (void)n, (void)kept;
    return 0;
}

/* float16 and bfloat16 scores, read as their bits: the code of |x| is the bits with
 * the sign cleared, every NaN one above +inf's (0x7C00 in float16, 0x7F80 in
 * bfloat16), plus one (0: not eligible), as funcprune/_select/_n_m.py's _CODES. */
#define NM_NAN_F16 0x7C01
#define NM_NAN_BF16 0x7F81

static inline int16_t nm_code_half(uint16_t x, int16_t nan) {
    int16_t bits = (int16_t)(x & 0x7FFFu);
    return (int16_t)((bits < nan ? bits : nan) + 1);
}

static inline int16_t nm_code_f16(uint16_t x) { return nm_code_half(x, NM_NAN_F16); }
static inline int16_t nm_code_bf16(uint16_t x) { return nm_code_half(x, NM_NAN_BF16); }

/* m = 4 in 16-bit codes: as nm_groups_of_4_f32, 16 entries (four groups) at a time. */
#ifdef NM_SHUFFLE
typedef int16_t nm_lanes16 __attribute__((vector_size(32)));

static inline __attribute__((always_inline)) int64_t nm_groups_of_4_half(
    const uint16_t *restrict x, const uint8_t *restrict e, int64_t len, int n, uint8_t *restrict kept,
    int16_t nan) {
#define NM_FOUR(a, b, c, d) a, b, c, d, a, b, c, d, a, b, c, d, a, b, c, d
    const nm_lanes16 later1 = {NM_FOUR(-1, -1, -1, 0)}, later2 = {NM_FOUR(-1, -1, 0, 0)},
                     later3 = {NM_FOUR(-1, 0, 0, 0)};
#undef NM_FOUR
    const nm_lanes16 zero = {0}, one = zero + 1, magnitude = zero + 0x7FFF, nan_code = zero + nan;
    const nm_lanes16 least = zero - (int16_t)n; /* 0 <= n <= 4 */
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        nm_lanes16 c;
        memcpy(&c, x + i, sizeof c);
        c &= magnitude;
        nm_lanes16 above = c > nan_code;
        c = ((c & ~above) | (nan_code & above)) + one;
        if (e) {
            const uint8_t *f = e + i;
            nm_lanes16 eligible = {f[0], f[1], f[2],  f[3],  f[4],  f[5],  f[6],  f[7],
                                   f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15]};
            c &= eligible != zero;
        }
        nm_lanes16 r1 = __builtin_shufflevector(c, c, 1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12);
        nm_lanes16 r2 = __builtin_shufflevector(c, c, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
        nm_lanes16 r3 = __builtin_shufflevector(c, c, 3, 0, 1, 2, 7, 4, 5, 6, 11, 8, 9, 10, 15, 12, 13, 14);
        nm_lanes16 minus_beaten = ((r1 > c) | ((r1 == c) & later1)) + ((r2 > c) | ((r2 == c) & later2)) +
                                  ((r3 > c) | ((r3 == c) & later3));
        nm_lanes16 keep = (minus_beaten > least) & (c != zero);
        nm_bytes16 bytes = __builtin_convertvector(keep & one, nm_bytes16);
        memcpy(kept + i, &bytes, sizeof bytes);
    }
    return i;
}
#else
static inline int64_t nm_groups_of_4_half(const uint16_t *x, const uint8_t *e, int64_t len, int n,
                                          uint8_t *kept, int16_t nan) {
    (void)x, (void)e, (void)len, (void)n, (void)kept, (void)nan;
    return 0;
}
#endif

static int64_t nm_groups_of_4_f16(const uint16_t *x, const uint8_t *e, int64_t len, int n, uint8_t *kept) {
    return nm_groups_of_4_half(x, e, len, n, kept, NM_NAN_F16);
}

static int64_t nm_groups_of_4_bf16(const uint16_t *x, const uint8_t *e, int64_t len, int n, uint8_t *kept) {
    return nm_groups_of_4_half(x, e, len, n, kept, NM_NAN_BF16);
}

#define N_M(SUFFIX, T, C)                                                               \
    /* c[i] for len entries, 0 where not eligible; c[-m..0) and c[len..len + m) too */ \
    static inline void nm_codes_##SUFFIX(const T *restrict x, const uint8_t *restrict e, \
                                         int64_t len, int m, C *restrict c) {          \
        if (e)                                                                         \
            for (int64_t i = 0; i < len; i++) c[i] = nm_code_##SUFFIX(x[i]) & -(C)(e[i] != 0); \
        else                                                                           \
            for (int64_t i = 0; i < len; i++) c[i] = nm_code_##SUFFIX(x[i]);           \
        for (int64_t i = 0; i < m; i++) c[i - m] = c[len + i] = 0; /* read, never chosen */ \
    }                                                                                  \
    /* len entries (whole groups of m) from x, e, to kept; place[i] = i % m */          \
    static void nm_run_##SUFFIX(const T *restrict x, const uint8_t *restrict e, int64_t len, \
                                int m, int n, const C *restrict place, uint8_t *restrict kept) { \
        C buffer[NM_MAX_M + NM_RUN + NM_MAX_M], beaten[NM_RUN];                        \
        C *restrict c = buffer + NM_MAX_M;                                             \
        nm_codes_##SUFFIX(x, e, len, m, c);                                            \
        for (int64_t i = 0; i < len; i++) beaten[i] = 0;                               \
        for (int r = 1; r < m; r++)                                                    \
            for (int64_t i = 0; i < len; i++) {                                        \
                C ci = c[i], after = c[i + r], before = c[i + r - m];                  \
                beaten[i] += place[i] + r < m ? after >= ci : before > ci;             \
            }                                                                          \
        for (int64_t i = 0; i < len; i++) kept[i] = (c[i] != 0) & (beaten[i] < n);     \
    }                                                                                  \
    /* the same in one pass, for a constant m once inlined */                          \
    static inline __attribute__((always_inline)) void nm_run_unrolled_##SUFFIX(         \
        const T *restrict x, const uint8_t *restrict e, int64_t len, int m, int n,       \
        const C *restrict place, uint8_t *restrict kept) {                             \
        C buffer[NM_MAX_M + NM_RUN + NM_MAX_M];                                        \
        C *restrict c = buffer + NM_MAX_M;                                             \
        nm_codes_##SUFFIX(x, e, len, m, c);                                            \
        for (int64_t i = 0; i < len; i++) {                                            \
            C ci = c[i], beaten = 0;                                                   \
            for (int r = 1; r < m; r++)                                                \
                beaten += place[i] + r < m ? c[i + r] >= ci : c[i + r - m] > ci;       \
            kept[i] = (ci != 0) & (beaten < n);                                        \
        }                                                                              \
    }                                                                                  \
    static void nm_runs_##SUFFIX(const T *x, const uint8_t *e, int64_t len, int m, int n, \
                                 const C *place, uint8_t *kept) {                      \
        int64_t per = NM_RUN / m * m;                                                  \
        int64_t i = m == 4 ? nm_groups_of_4_##SUFFIX(x, e, len, n, kept) : 0;          \
        for (; i < len; i += per) {                                                    \
            const uint8_t *ei = e ? e + i : NULL;                                      \
            int64_t part = len - i < per ? len - i : per;                              \
            if (m == 4) nm_run_unrolled_##SUFFIX(x + i, ei, part, 4, n, place, kept + i); \
            else if (m == 2) nm_run_unrolled_##SUFFIX(x + i, ei, part, 2, n, place, kept + i); \
            else nm_run_##SUFFIX(x + i, ei, part, m, n, place, kept + i);              \
        }                                                                              \
    }                                                                                  \
    /* w <= NM_TILE groups side by side, entry t of group j at t * inner + j */       \
    static void nm_columns_##SUFFIX(const T *restrict x, const uint8_t *restrict e,     \
                                    int64_t inner, int64_t w, int m, int n,            \
                                    uint8_t *restrict kept) {                          \
        C c[NM_MAX_M][NM_TILE];                                                        \
        for (int t = 0; t < m; t++) {                                                  \
            const T *xt = x + t * inner;                                               \
            const uint8_t *et = e ? e + t * inner : NULL;                              \
            if (et)                                                                    \
                for (int64_t j = 0; j < w; j++) c[t][j] = nm_code_##SUFFIX(xt[j]) & -(C)(et[j] != 0); \
            else                                                                       \
                for (int64_t j = 0; j < w; j++) c[t][j] = nm_code_##SUFFIX(xt[j]);     \
        }                                                                              \
        for (int t = 0; t < m; t++) {                                                  \
            C beaten[NM_TILE];                                                         \
            for (int64_t j = 0; j < w; j++) beaten[j] = 0;                             \
            for (int s = 0; s < t; s++)                                                \
                for (int64_t j = 0; j < w; j++) beaten[j] += c[s][j] > c[t][j];        \
            for (int s = t + 1; s < m; s++)                                            \
                for (int64_t j = 0; j < w; j++) beaten[j] += c[s][j] >= c[t][j];       \
            for (int64_t j = 0; j < w; j++)                                            \
                kept[t * inner + j] = (c[t][j] != 0) & (beaten[j] < n);                \
        }                                                                              \
    }                                                                                  \
    /* kept[i] (0/1) for x viewed as (units, m, inner); e NULL (all eligible) or 0/1   \
       bytes. Returns 0, or -1 (nothing written) where m is not in [1, NM_MAX_M]. */   \
    int fp_n_m_##SUFFIX(const T *x, const uint8_t *e, int64_t units, int64_t m,        \
                        int64_t inner, int64_t n, uint8_t *kept, int threads) {        \
        (void)threads; /* without OpenMP */                                            \
        if (m < 1 || m > NM_MAX_M || units < 0 || inner < 1) return -1;                \
        int n_ = n < 0 ? 0 : n > m ? (int)m : (int)n;                                  \
        if (inner == 1) {                                                              \
            int64_t total = units * m, item = NM_RUN / m * m * NM_RUNS;                \
            int64_t items = (total + item - 1) / item;                                 \
            C place[NM_RUN]; /* each entry's place in its group */                     \
            for (int64_t i = 0, p = 0; i < NM_RUN; i++, p = p + 1 == m ? 0 : p + 1) place[i] = (C)p; \
            _Pragma("omp parallel for num_threads(threads) schedule(static)")         \
            for (int64_t k = 0; k < items; k++) {                                      \
                int64_t i = k * item, len = total - i < item ? total - i : item;       \
                nm_runs_##SUFFIX(x + i, e ? e + i : NULL, len, (int)m, n_, place, kept + i); \
            }                                                                          \
            return 0;                                                                  \
        }                                                                              \
        int64_t tiles = (inner + NM_TILE - 1) / NM_TILE;                               \
        _Pragma("omp parallel for num_threads(threads) schedule(static)")             \
        for (int64_t k = 0; k < units * tiles; k++) {                                  \
            int64_t u = k / tiles, j = k % tiles * NM_TILE;                            \
            int64_t at = u * m * inner + j, w = inner - j < NM_TILE ? inner - j : NM_TILE; \
            nm_columns_##SUFFIX(x + at, e ? e + at : NULL, inner, w, (int)m, n_, kept + at); \
        }                                                                              \
        return 0;                                                                      \
    }

N_M(f32, float, int32_t)
N_M(f64, double, int64_t)
N_M(f16, uint16_t, int16_t)
N_M(bf16, uint16_t, int16_t)

/* ---- block masks: which blocks keep an entry of a bool mask, and the mask from kept blocks ----
 *
 * For the Block spec (funcprune/_select/_blocks.py), around its selection over
 * blocks: one pass each, in one parallel region (a row of blocks at a time,
 * shared among the threads as they are free). A mask is rows of width = C * b
 * bytes; block (p, c), for p < P and c < C, covers rows p * a + i (i < a),
 * bytes c * b to c * b + b - 1. fp_block_any writes any[p * C + c] = 1 where a
 * byte of the block is nonzero; fp_block_expand writes out = kept[p * C + c]
 * over each block, and'ed with mask where it is not NULL (bytes 0 or 1).
 */

#define BLOCK_WIDTHS(CALL)                                                              \
    if (b == 4) CALL(4);                                                                \
    else if (b == 8) CALL(8);                                                           \
    else if (b == 2) CALL(2);                                                           \
    else if (b == 1) CALL(1);                                                           \
    else if (b == 16) CALL(16);                                                         \
    else CALL(b)

static inline __attribute__((always_inline)) void block_any_row(
    const uint8_t *restrict mask, int64_t a, int64_t C, int64_t b, uint8_t *restrict any) {
    for (int64_t c = 0; c < C; c++) any[c] = 0;
    for (int64_t i = 0; i < a; i++) {
        const uint8_t *restrict row = mask + i * C * b;
        for (int64_t c = 0; c < C; c++) {
            uint8_t set = 0;
            for (int64_t j = 0; j < b; j++) set |= row[c * b + j];
            any[c] |= set != 0;
        }
    }
}

void fp_block_any(const uint8_t *mask, int64_t P, int64_t a, int64_t C, int64_t b, uint8_t *any,
                  int threads) {
    (void)threads; /* without OpenMP */
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 8)")
    for (int64_t p = 0; p < P; p++) {
        const uint8_t *m = mask + p * a * C * b;
        uint8_t *o = any + p * C;
#define BLOCK_ANY(B) block_any_row(m, a, C, B, o)
        BLOCK_WIDTHS(BLOCK_ANY);
#undef BLOCK_ANY
    }
}

static inline __attribute__((always_inline)) void block_expand_row(
    const uint8_t *restrict kept, const uint8_t *restrict mask, int64_t a, int64_t C, int64_t b,
    uint8_t *restrict out) {
    for (int64_t i = 0; i < a; i++) {
        uint8_t *restrict row = out + i * C * b;
        if (mask) {
            const uint8_t *restrict earlier = mask + i * C * b;
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < b; j++) row[c * b + j] = kept[c] & (earlier[c * b + j] != 0);
        } else {
            for (int64_t c = 0; c < C; c++)
                for (int64_t j = 0; j < b; j++) row[c * b + j] = kept[c];
        }
    }
}

void fp_block_expand(const uint8_t *kept, const uint8_t *mask, int64_t P, int64_t a, int64_t C,
                     int64_t b, uint8_t *out, int threads) {
    (void)threads; /* without OpenMP */
    _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 8)")
    for (int64_t p = 0; p < P; p++) {
        const uint8_t *k = kept + p * C, *m = mask ? mask + p * a * C * b : NULL;
        uint8_t *o = out + p * a * C * b;
#define BLOCK_EXPAND(B) block_expand_row(k, m, a, C, B, o)
        BLOCK_WIDTHS(BLOCK_EXPAND);
#undef BLOCK_EXPAND
    }
}

/* ---- SparseGPT: one block of columns, the column loop (funcprune/_criteria/_sparsegpt.py) ----
 *
 * w: rows of the block (width entries each, ldw apart), updated in place to
 * the kept values (0 where pruned); u: the block of the upper Cholesky factor
 * of H^-1 (rows ldu apart), its diagonal d; pruned: rows x width flags, read,
 * or, for N:M (m > 0), written group by group when the group's first column
 * is reached: the m - n of lowest score w^2 / d^2 (on the weights as updated
 * so far) go, ties to the lower column, NaN above every number, as a stable
 * ascending sort's first m - n; err: rows x width, written. Per column i, as
 * the torch loop: q = pruned ? 0 : w_i; err_i = (w_i - q) / d_i; then
 * w_j = w_j - err_i * u_ij for j > i, each product rounded, then the
 * difference (no contraction: the bits of the torch path's outer product and
 * subtraction), in the order of i.
 *
 * Rows are independent, and each row's columns depend on one another: the
 * kernel runs SPARSEGPT_TILE rows at once, one in each lane of a vector (a
 * tile of the block transposed into a buffer of the thread's), so that every
 * step, the division and the N:M ranks included, is one vector operation over
 * the tile's rows. The order of the updates is kept while they are gathered:
 * the columns are taken SPARSEGPT_STEP (a multiple of m) at a time; within a
 * step each error updates the step's later columns at once, and each column
 * right of the step then takes the step's errors one after the other in a
 * register. Tiles are shared among the threads. Returns 0, or -1 (nothing
 * written) where the arguments do not fit (m not dividing width, n outside
 * [0, m], m above NM_MAX_M), or -2 where memory could not be had (some
 * rows may be written: the caller raises).
 */

#define SPARSEGPT_STEP 16
/* A tile's vector: as wide as the CPU's (16 floats with AVX-512, 8 with AVX2, 4 elsewhere): a wider
 * one, split by the compiler, measured slower than the CPU's own. */
#if defined(__AVX512F__)
#define SPARSEGPT_BYTES 64
#elif defined(__AVX__)
#define SPARSEGPT_BYTES 32
#else
#define SPARSEGPT_BYTES 16
#endif

#define SPARSEGPT_BLOCK(SUFFIX, T, I, MAGNITUDE, NAN_CODE)                               \
    enum { sparsegpt_lanes_##SUFFIX = SPARSEGPT_BYTES / sizeof(T) };                      \
    typedef T sparsegpt_v_##SUFFIX __attribute__((vector_size(SPARSEGPT_BYTES)));        \
    typedef I sparsegpt_i_##SUFFIX __attribute__((vector_size(SPARSEGPT_BYTES)));        \
    /* Flags of the m - n lowest scores of the group of columns i..i + m: a score      \
       w^2 / d^2 is +0.0 or more, or NaN, ranked by its bits with the sign cleared (a  \
       NaN's sign is not fixed), every NaN one code above +inf. */                      \
    static inline void sparsegpt_group_##SUFFIX(const sparsegpt_v_##SUFFIX *restrict b, \
        const T *restrict u, int64_t ldu, int64_t i, int64_t n, int64_t m,              \
        sparsegpt_i_##SUFFIX *restrict pruned) {                                        \
        typedef sparsegpt_i_##SUFFIX VI;                                                \
        VI code[NM_MAX_M];                                                              \
        for (int64_t t = 0; t < m; t++) {                                               \
            T d = u[(i + t) * ldu + i + t];                                             \
            VI bits = (VI)((b[i + t] * b[i + t]) / (d * d)) & (I)MAGNITUDE;             \
            VI over = bits > (I)NAN_CODE;                                               \
            code[t] = (bits & ~over) | ((I)NAN_CODE & over);                            \
        }                                                                               \
        for (int64_t t = 0; t < m; t++) { /* its rank in the stable ascending sort */   \
            VI rank = code[0] - code[0];                                                \
            for (int64_t s = 0; s < t; s++) rank -= code[s] <= code[t];                 \
            for (int64_t s = t + 1; s < m; s++) rank -= code[s] < code[t];              \
            pruned[i + t] = rank < (I)(m - n);                                          \
        }                                                                               \
    }                                                                                   \
    /* The tile's columns from `end` on take the errors e[s..end) in turn, four      \
       columns at a time (four chains of subtractions in flight). */                    \
    static inline void sparsegpt_rest_##SUFFIX(sparsegpt_v_##SUFFIX *restrict b,        \
        const sparsegpt_v_##SUFFIX *restrict e, const T *restrict u, int64_t ldu,       \
        int64_t s, int64_t end, int64_t width) {                                        \
        typedef sparsegpt_v_##SUFFIX V;                                                 \
        int64_t j = end;                                                                \
        for (; j + 4 <= width; j += 4) {                                                \
            V a0 = b[j], a1 = b[j + 1], a2 = b[j + 2], a3 = b[j + 3];                   \
            for (int64_t k = s; k < end; k++) {                                         \
                const T *uk = u + k * ldu + j;                                          \
                a0 = a0 - e[k] * uk[0];                                                 \
                a1 = a1 - e[k] * uk[1];                                                 \
                a2 = a2 - e[k] * uk[2];                                                 \
                a3 = a3 - e[k] * uk[3];                                                 \
            }                                                                           \
            b[j] = a0, b[j + 1] = a1, b[j + 2] = a2, b[j + 3] = a3;                     \
        }                                                                               \
        for (; j < width; j++) {                                                        \
            V a = b[j];                                                                 \
            for (int64_t k = s; k < end; k++) a = a - e[k] * u[k * ldu + j];            \
            b[j] = a;                                                                   \
        }                                                                               \
    }                                                                                   \
    /* Rows r0..r0 + lanes (lanes <= the tile), through the thread's buffers b, e, p. */ \
    static void sparsegpt_tile_##SUFFIX(T *w, int64_t ldw, int64_t r0, int lanes,        \
        int64_t width, const T *u, int64_t ldu, uint8_t *pruned, int64_t n, int64_t m,  \
        int64_t step, T *err, sparsegpt_v_##SUFFIX *restrict b,                         \
        sparsegpt_v_##SUFFIX *restrict e, sparsegpt_i_##SUFFIX *restrict p) {           \
        typedef sparsegpt_v_##SUFFIX V;                                                 \
        typedef sparsegpt_i_##SUFFIX VI;                                                \
        for (int64_t j = 0; j < width; j++) {                                           \
            V column = {0}; /* lanes past the last row: 0, never pruned */              \
            VI flags = {0};                                                             \
            for (int l = 0; l < lanes; l++) {                                           \
                column[l] = w[(r0 + l) * ldw + j];                                      \
                flags[l] = m > 0 ? 0 : -(I)(pruned[(r0 + l) * width + j] != 0);         \
            }                                                                           \
            b[j] = column;                                                              \
            p[j] = flags;                                                               \
        }                                                                               \
        for (int64_t s = 0; s < width; s += step) {                                     \
            int64_t end = width - s < step ? width : s + step;                          \
            for (int64_t i = s; i < end; i++) {                                         \
                const T *ui = u + i * ldu;                                              \
                if (m > 0 && i % m == 0) sparsegpt_group_##SUFFIX(b, u, ldu, i, n, m, p); \
                V column = b[i];                                                        \
                V q = (V)((VI)column & ~p[i]);                                          \
                V err_i = (column - q) / ui[i];                                         \
                b[i] = q;                                                               \
                e[i] = err_i;                                                           \
                for (int64_t j = i + 1; j < end; j++) b[j] = b[j] - err_i * ui[j];      \
            }                                                                           \
            sparsegpt_rest_##SUFFIX(b, e, u, ldu, s, end, width);                       \
        }                                                                               \
        for (int l = 0; l < lanes; l++) {                                               \
            T *wr = w + (r0 + l) * ldw, *er = err + (r0 + l) * width;                   \
            uint8_t *pr = pruned + (r0 + l) * width;                                    \
            for (int64_t j = 0; j < width; j++) {                                       \
                wr[j] = b[j][l];                                                        \
                er[j] = e[j][l];                                                        \
                if (m > 0) pr[j] = p[j][l] != 0;                                        \
            }                                                                           \
        }                                                                               \
    }                                                                                   \
    int fp_sparsegpt_block_##SUFFIX(T *w, int64_t ldw, int64_t rows, int64_t width,     \
                                    const T *u, int64_t ldu, uint8_t *pruned, int64_t n, \
                                    int64_t m, T *err, int threads) {                   \
        if (rows < 0 || width < 1) return -1;                                           \
        if (m > 0 && (m > NM_MAX_M || width % m || n < 0 || n > m)) return -1;           \
        int64_t step = m > SPARSEGPT_STEP ? m : SPARSEGPT_STEP / (m > 0 ? m : 1) * (m > 0 ? m : 1); \
        int64_t tiles = (rows + sparsegpt_lanes_##SUFFIX - 1) / sparsegpt_lanes_##SUFFIX;  \
        /* u's block packed (rows width apart): rows ldu apart, often a power of two, */ \
        /* share the cache's sets, and a step's rows would evict one another */          \
        T *packed = malloc((size_t)width * (size_t)width * sizeof(T));                  \
        if (!packed) return -2;                                                         \
        for (int64_t i = 0; i < width; i++) memcpy(packed + i * width, u + i * ldu, (size_t)width * sizeof(T)); \
        int failed = 0;                                                                 \
        (void)threads; /* without OpenMP */                                             \
        _Pragma("omp parallel num_threads(threads)")                                   \
        {                                                                               \
            size_t bytes = (size_t)width * SPARSEGPT_BYTES;                             \
            void *b = aligned_alloc(SPARSEGPT_BYTES, bytes), *e = aligned_alloc(SPARSEGPT_BYTES, bytes); \
            void *p = aligned_alloc(SPARSEGPT_BYTES, bytes);                            \
            _Pragma("omp for schedule(dynamic, 4)")                                    \
            for (int64_t t = 0; t < tiles; t++) {                                       \
                if (!b || !e || !p) {                                                   \
                    _Pragma("omp atomic write")                                        \
                    failed = 1;                                                         \
                    continue;                                                           \
                }                                                                       \
                int64_t r0 = t * sparsegpt_lanes_##SUFFIX, left = rows - r0;             \
                int lanes = left < sparsegpt_lanes_##SUFFIX ? (int)left : sparsegpt_lanes_##SUFFIX; \
                sparsegpt_tile_##SUFFIX(w, ldw, r0, lanes, width, packed, width, pruned, n, m, \
                                        step, err, b, e, p);                            \
            }                                                                           \
            free(b);                                                                    \
            free(e);                                                                    \
            free(p);                                                                    \
        }                                                                               \
        free(packed);                                                                   \
        return failed ? -2 : 0;                                                         \
    }

SPARSEGPT_BLOCK(f32, float, int32_t, 0x7FFFFFFF, 0x7F800001)
SPARSEGPT_BLOCK(f64, double, int64_t, 0x7FFFFFFFFFFFFFFFLL, 0x7FF0000000000001LL)

/* ---- unit keys: per index of a dim, the largest |x|, and the sum of rounded terms ----
 *
 * For funcprune/_plans/_unit_keys.py, one read each where torch makes
 * several passes. x is read as [A, L, B]: entry (a, l, b) at
 * x[a * sa + l * B + b] (a narrow along the dim of a contiguous tensor:
 * the dims before it flattened into A, those after it into B), and each
 * kernel writes one double per index l.
 *
 * unit_abs_max: the largest |x| over a and b, NaN where one is NaN (the
 * torch path's max(amax, -amin), read once).
 *
 * unit_rounded: the sum over a and b of (t + M[l]) - M[l], t = x * x
 * (square) or |x| in double. The caller picks each M so that every such
 * term is a multiple of one quantum and every partial sum of them is exact
 * (the reproducible summation's pre-rounding): the sum is then the same in
 * any order, the torch path's chunked sums bit for bit. Non-finite terms
 * give whatever IEEE gives; the caller's flags override them.
 *
 * Threads take disjoint runs of l (each run's indices are one thread's).
 */

#define UNIT_LANES 8
/* rows of x read together where B == 1: one load and store of out[l] per UNIT_ROWS of them */
#define UNIT_ROWS 8
/* indices along the dim whose maxima one pass down the rows keeps (on the stack) where B == 1 */
#define UNIT_CHUNK 2048

/* NaN-propagating maximum: once o is NaN, neither test holds again, and it stays. */
#define UNIT_MAX(o, m) ((m) > (o) || (m) != (m) ? (m) : (o))

#define UNIT_KEYS(SUFFIX, T, UT, SIGN_OFF)                                                   \
    static inline double unit_term_##SUFFIX(T v, int square) {                              \
        double d = (double)v;                                                               \
        return square ? d * d : fabs(d);                                                    \
    }                                                                                       \
    static inline double unit_round_##SUFFIX(T v, double m, int square) {                   \
        return (unit_term_##SUFFIX(v, square) + m) - m;                                     \
    }                                                                                       \
    /* B == 1: sums down the rows, UNIT_ROWS at a time, across l in vector lanes */          \
    static inline __attribute__((always_inline)) void unit_rounded_columns_##SUFFIX(        \
        const T *restrict x, int64_t A, int64_t l0, int64_t l1, int64_t sa,                 \
        const double *restrict big, int square, double *restrict out) {                     \
        int64_t a = 0;                                                                      \
        for (; a + UNIT_ROWS <= A; a += UNIT_ROWS) {                                        \
            const T *restrict r = x + a * sa;                                               \
            for (int64_t l = l0; l < l1; l++) {                                             \
                double m = big[l], acc = out[l];                                            \
                for (int i = 0; i < UNIT_ROWS; i++)                                         \
                    acc += unit_round_##SUFFIX(r[i * sa + l], m, square);                   \
                out[l] = acc;                                                               \
            }                                                                               \
        }                                                                                   \
        for (; a < A; a++)                                                                  \
            for (int64_t l = l0; l < l1; l++)                                               \
                out[l] += unit_round_##SUFFIX(x[a * sa + l], big[l], square);               \
    }                                                                                       \
    static inline __attribute__((always_inline)) void unit_rounded_rows_##SUFFIX(           \
        const T *restrict x, int64_t A, int64_t l0, int64_t l1, int64_t B, int64_t sa,      \
        const double *restrict big, int square, double *restrict out) {                     \
        for (int64_t a = 0; a < A; a++)                                                     \
            for (int64_t l = l0; l < l1; l++) {                                             \
                const T *restrict r = x + a * sa + l * B;                                   \
                double m = big[l], acc[UNIT_LANES] = {0};                                   \
                int64_t b = 0;                                                              \
                for (; b + UNIT_LANES <= B; b += UNIT_LANES)                                \
                    for (int j = 0; j < UNIT_LANES; j++)                                    \
                        acc[j] += unit_round_##SUFFIX(r[b + j], m, square);                 \
                double s = 0.0;                                                             \
                for (int j = 0; j < UNIT_LANES; j++) s += acc[j];                           \
                for (; b < B; b++) s += unit_round_##SUFFIX(r[b], m, square);               \
                out[l] += s;                                                                \
            }                                                                               \
    }                                                                                       \
    static void unit_rounded_run_##SUFFIX(const T *x, int64_t A, int64_t l0, int64_t l1,    \
                                          int64_t B, int64_t sa, const double *big,         \
                                          int square, double *out) {                        \
        for (int64_t l = l0; l < l1; l++) out[l] = 0.0;                                     \
        if (B == 1 && square)                                                               \
            unit_rounded_columns_##SUFFIX(x, A, l0, l1, sa, big, 1, out);                   \
        else if (B == 1)                                                                    \
            unit_rounded_columns_##SUFFIX(x, A, l0, l1, sa, big, 0, out);                   \
        else if (square)                                                                    \
            unit_rounded_rows_##SUFFIX(x, A, l0, l1, B, sa, big, 1, out);                   \
        else                                                                                \
            unit_rounded_rows_##SUFFIX(x, A, l0, l1, B, sa, big, 0, out);                   \
    }                                                                                       \
    /* |x| as its bits, sign cleared: ordered as the values, NaN above +inf (propagated by max) */ \
    static inline UT unit_abs_bits_##SUFFIX(T v) {                                           \
        UT u;                                                                               \
        memcpy(&u, &v, sizeof u);                                                           \
        return u & SIGN_OFF;                                                                \
    }                                                                                       \
    static inline double unit_from_bits_##SUFFIX(UT u) {                                    \
        T v;                                                                                \
        memcpy(&v, &u, sizeof v);                                                           \
        return (double)v;                                                                   \
    }                                                                                       \
    static void unit_abs_max_run_##SUFFIX(const T *restrict x, int64_t A, int64_t l0,       \
                                          int64_t l1, int64_t B, int64_t sa,                \
                                          double *restrict out) {                           \
        if (B == 1) { /* down the rows, UNIT_CHUNK indices at a time in vector lanes */      \
            for (int64_t c = l0; c < l1; c += UNIT_CHUNK) {                                 \
                int64_t n = l1 - c < UNIT_CHUNK ? l1 - c : UNIT_CHUNK;                      \
                UT o[UNIT_CHUNK] = {0};                                                     \
                for (int64_t a = 0; a < A; a++) {                                           \
                    const T *restrict r = x + a * sa + c;                                   \
                    for (int64_t k = 0; k < n; k++) {                                       \
                        UT u = unit_abs_bits_##SUFFIX(r[k]);                                \
                        o[k] = u > o[k] ? u : o[k];                                         \
                    }                                                                       \
                }                                                                           \
                for (int64_t k = 0; k < n; k++) out[c + k] = unit_from_bits_##SUFFIX(o[k]); \
            }                                                                               \
            return;                                                                         \
        }                                                                                   \
        for (int64_t l = l0; l < l1; l++) out[l] = 0.0;                                     \
        for (int64_t a = 0; a < A; a++)                                                     \
            for (int64_t l = l0; l < l1; l++) {                                             \
                const T *restrict r = x + a * sa + l * B;                                   \
                UT o = 0;                                                                   \
                for (int64_t b = 0; b < B; b++) {                                           \
                    UT u = unit_abs_bits_##SUFFIX(r[b]);                                    \
                    o = u > o ? u : o;                                                      \
                }                                                                           \
                double m = unit_from_bits_##SUFFIX(o), p = out[l];                          \
                out[l] = UNIT_MAX(p, m);                                                    \
            }                                                                               \
    }                                                                                       \
    /* runs of l: of 32768 entries at least, at most 4 per thread (a busy core's left to others) */ \
    static int64_t unit_runs_##SUFFIX(int64_t A, int64_t L, int64_t B, int threads) {        \
        int64_t per = A * B > 0 ? (32768 + A * B - 1) / (A * B) : L;                        \
        int64_t runs = L / (per > 0 ? per : 1);                                             \
        int64_t most = (int64_t)threads * 4;                                                \
        if (runs > most) runs = most;                                                       \
        return runs < 1 ? 1 : runs;                                                         \
    }                                                                                       \
    void fp_unit_rounded_##SUFFIX(const T *x, int64_t A, int64_t L, int64_t B, int64_t sa,  \
                                  const double *big, int square, double *out, int threads) { \
        int64_t runs = unit_runs_##SUFFIX(A, L, B, threads);                                \
        (void)threads; /* without OpenMP */                                                 \
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1)")              \
        for (int64_t t = 0; t < runs; t++)                                                  \
            unit_rounded_run_##SUFFIX(x, A, L * t / runs, L * (t + 1) / runs, B, sa, big,   \
                                      square, out);                                         \
    }                                                                                       \
    void fp_unit_abs_max_##SUFFIX(const T *x, int64_t A, int64_t L, int64_t B, int64_t sa,  \
                                  double *out, int threads) {                               \
        int64_t runs = unit_runs_##SUFFIX(A, L, B, threads);                                \
        (void)threads; /* without OpenMP */                                                 \
        _Pragma("omp parallel for num_threads(threads) schedule(dynamic, 1)")              \
        for (int64_t t = 0; t < runs; t++)                                                  \
            unit_abs_max_run_##SUFFIX(x, A, L * t / runs, L * (t + 1) / runs, B, sa, out);  \
    }

UNIT_KEYS(f32, float, uint32_t, 0x7FFFFFFFu)
UNIT_KEYS(f64, double, uint64_t, 0x7FFFFFFFFFFFFFFFull)
