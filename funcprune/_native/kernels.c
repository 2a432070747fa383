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

/* The scan's inner step, 16 floats (8 doubles) at a time where the compiler
 * targets AVX-512: adds the count below lo to *below, stores the keys inside
 * [lo, hi] at out + *found (a full vector's room is needed there) and moves
 * *found on; returns how many keys it looked at (a multiple of the width; the
 * caller finishes the rest). Elsewhere it looks at none. Comparisons are
 * ordered and quiet, as C's: NaN is neither below nor inside. */
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
 * in index order go. Keys as in the scan. Writes 0/1 bytes to `kept`.
 */

#define SURVIVORS(NAME, T, ABS)                                                       \
    void NAME(const T *restrict x, const uint8_t *restrict e, int64_t n, int absolute, \
              T v, int64_t take, uint8_t *restrict kept, int threads) {               \
        (void)threads; /* without OpenMP */                                           \
        if (take < 0) { /* every tie goes: no order to keep, vectorized loops */      \
            if (absolute && e) {                                                      \
                _Pragma("omp parallel for num_threads(threads) schedule(static)")    \
                for (int64_t i = 0; i < n; i++) kept[i] = (!(ABS(x[i]) <= v)) & (e[i] != 0); \
            } else if (absolute) {                                                    \
                _Pragma("omp parallel for num_threads(threads) schedule(static)")    \
                for (int64_t i = 0; i < n; i++) kept[i] = !(ABS(x[i]) <= v);          \
            } else if (e) {                                                           \
                _Pragma("omp parallel for num_threads(threads) schedule(static)")    \
                for (int64_t i = 0; i < n; i++) kept[i] = (!(x[i] <= v)) & (e[i] != 0); \
            } else {                                                                  \
                _Pragma("omp parallel for num_threads(threads) schedule(static)")    \
                for (int64_t i = 0; i < n; i++) kept[i] = !(x[i] <= v);               \
            }                                                                         \
            return;                                                                   \
        }                                                                             \
        for (int64_t i = 0; i < n; i++) {                                             \
            T k = absolute ? ABS(x[i]) : x[i];                                        \
            if (e && !e[i]) k = (T)INFINITY;                                          \
            uint8_t keep = (!(k < v)) & (!e || e[i] != 0);                            \
            if (k == v && take > 0) {                                                 \
                keep = 0;                                                             \
                take--;                                                               \
            }                                                                         \
            kept[i] = keep;                                                           \
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
