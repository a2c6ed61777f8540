// int4 weights x int8 activations, and a verify's attention: specdec's CPU kernels (int4_matmul.py
// builds this file once per machine and says why it exists). One source, two builds: with AVX512
// (+VNNI) flags a 16-lane vector is one register, with AVX2 (+FMA, F16C) flags two; the builds give
// the same bits (tested), because every float step runs lane by lane in the same order and the sums
// across lanes add in one fixed order; only integer sums (exact in any order) differ in how they run.
//
// Weights: 16 outputs at a time, so that a vector's 16 lanes are 16 outputs and no sum ever
// crosses lanes. For outputs n0..n0+15 and inputs 8c..8c+7, 64 bytes: byte 4j + i holds input
// 8c + i of output n0 + j in its low nibble and input 8c + 4 + i in its high nibble (AVX2 loads the
// first 32 bytes for outputs 0..7, the next 32 for 8..15). A group of `group_size` inputs (a
// multiple of 16) has a scale and a minimum per output: w = q * scale + min, q in 0..15; scales
// and minimums are stored [N / 16, groups, 16] in float16 (as llama.cpp's Q4_K: in float32 they
// were 12% of the bytes a token streams at a group of 128, in float16 6%).
// Activations: each row quantized to int8 with one scale (max |x| / 127), so a row's result never
// depends on the other rows of the call: integer dot products are exact and every float step runs
// in the same order at any width, which keeps a verify of k + 1 tokens equal, row for row, to k + 1
// single-token steps (speculative decoding's exactness rests on that).

// ATen and the op registry only: torch/extension.h (pybind11, autograd) took 25 s to compile, these 6
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 16;     // outputs a vector holds
constexpr int64_t kChunk = 8;      // inputs one 64-byte chunk carries for 16 outputs
// activation rows that share one unpacking of the weights: a verify of k + 1 tokens then streams
// and unpacks them once (in tiles of 4, a 5-token verify cost 2.1 one-token steps of the layers;
// measured). AVX2's 16 registers hold 4 rows' sums.
#if defined(__AVX512F__)
constexpr int kRowsTile = 8;
#else
constexpr int kRowsTile = 4;
#endif

// --------------------------------------------------------------------------- 16-lane vectors

// 8 lanes summed as GCC's _mm512_reduce_add_ps sums the halves of 16: fixed, in both builds
inline float sum_of_eight(__m256 x) {
  const __m128 four = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(two) + _mm_cvtss_f32(_mm_shuffle_ps(two, two, 1));
}

inline float largest_of_eight(__m256 x) {
  const __m128 four = _mm_max_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  const __m128 two = _mm_max_ps(four, _mm_movehl_ps(four, four));
  return std::max(_mm_cvtss_f32(two), _mm_cvtss_f32(_mm_shuffle_ps(two, two, 1)));
}

inline int32_t sum_of_eight(__m256i x) {
  const __m128i four = _mm_add_epi32(_mm256_extracti128_si256(x, 1), _mm256_castsi256_si128(x));
  const __m128i two = _mm_add_epi32(four, _mm_unpackhi_epi64(four, four));
  return _mm_cvtsi128_si32(two) + _mm_cvtsi128_si32(_mm_shuffle_epi32(two, 1));
}

inline int32_t four_bytes(const int8_t* values) {
  int32_t word;
  std::memcpy(&word, values, sizeof(word));
  return word;
}

#if defined(__AVX512F__)

struct Floats { __m512 v; };
struct Ints { __m512i v; };  // 16 int32

inline Floats zeros() { return {_mm512_setzero_ps()}; }
inline Floats splat(float x) { return {_mm512_set1_ps(x)}; }
inline Floats load_floats(const float* x) { return {_mm512_loadu_ps(x)}; }

inline Floats load_floats(const at::BFloat16* x) {  // bfloat16 is float32's upper half
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16))};
}

inline Floats load_floats(const at::Half* x) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)))};
}

inline void store_floats(float* out, Floats x) { _mm512_storeu_ps(out, x.v); }

// rounded to nearest even as torch's float -> bfloat16 (NaN stays a quiet NaN), without
// AVX512-BF16's instruction: CPUs with VNNI but no BF16 (Cascade Lake, Ice Lake) run this too
inline void store_floats(at::BFloat16* out, Floats x) {
  const __m512i bits = _mm512_castps_si512(x.v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  rounded = _mm512_mask_mov_epi32(rounded, _mm512_cmp_ps_mask(x.v, x.v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(rounded));
}

inline Floats operator+(Floats a, Floats b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Floats operator-(Floats a, Floats b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Floats operator*(Floats a, Floats b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Floats fmadd(Floats a, Floats b, Floats c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Floats fnmadd(Floats a, Floats b, Floats c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline Floats maximum(Floats a, Floats b) { return {_mm512_max_ps(a.v, b.v)}; }  // b where either is NaN
inline Floats absolute(Floats a) { return {_mm512_abs_ps(a.v)}; }
inline Floats round_to_integer(Floats a) { return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT)}; }
// p * 2^n for integral n in -126..127 (one rounding, as the multiply by a normal 2^n AVX2 does)
inline Floats times_power_of_two(Floats p, Floats n) { return {_mm512_scalef_ps(p.v, n.v)}; }
inline Floats zero_where_below(Floats value, Floats x, float bound) {
  return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~_mm512_cmp_ps_mask(x.v, _mm512_set1_ps(bound), _CMP_LT_OQ)), value.v)};
}
inline float sum_of(Floats x) {
  return sum_of_eight(_mm256_add_ps(_mm512_extractf32x8_ps(x.v, 1), _mm512_castps512_ps256(x.v)));
}
inline float largest_of(Floats x) {
  return largest_of_eight(_mm256_max_ps(_mm512_extractf32x8_ps(x.v, 1), _mm512_castps512_ps256(x.v)));
}

inline Ints zero_ints() { return {_mm512_setzero_si512()}; }
inline Ints operator+(Ints a, Ints b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline Ints to_ints(Floats a) { return {_mm512_cvtps_epi32(a.v)}; }  // to nearest even
inline Floats to_floats(Ints a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline int32_t sum_of(Ints x) { return _mm512_reduce_add_epi32(x.v); }
inline void store_int8(int8_t* out, Ints x) {  // saturated
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_cvtsepi32_epi8(x.v));
}

// one group's int32 dot products for TILE rows: `weights` its group_size / 8 chunks of 64 bytes,
// a[t] row t's int8 activations for it. Independent sums, so that no chain waits on a multiply-add's
// latency: four a row up to 4 rows (two chunks in flight, low and high nibbles apart), two a row
// beyond (more rows are more chains; 32 registers hold no more). Integer sums: exact in any split.
// Inlined: as a call, the sums went through the stack (a 4-row tile ran 1.2x slower).
template <int TILE>
__attribute__((always_inline)) inline void group_dots(const uint8_t* weights, const int8_t* const* a,
                                                      int64_t group_size, Ints* dots) {
  constexpr int kSums = TILE <= 4 ? 4 : 2;
  const __m512i low_mask = _mm512_set1_epi8(0x0F);
  __m512i sums[TILE][kSums];
  for (int t = 0; t < TILE; ++t)
    for (int c = 0; c < kSums; ++c) sums[t][c] = _mm512_setzero_si512();
  for (int64_t k = 0; k < group_size; k += 2 * kChunk) {
    for (int half = 0; half < 2; ++half) {
      const int64_t at = k + half * kChunk;
      const __m512i packed = _mm512_loadu_si512(weights + at * kLanes / 2);
      const __m512i low = _mm512_and_si512(packed, low_mask);
      const __m512i high = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_mask);
      for (int t = 0; t < TILE; ++t) {
        __m512i& low_sum = sums[t][(2 * half) % kSums];
        __m512i& high_sum = sums[t][(2 * half + 1) % kSums];
        low_sum = _mm512_dpbusd_epi32(low_sum, low, _mm512_set1_epi32(four_bytes(a[t] + at)));
        high_sum = _mm512_dpbusd_epi32(high_sum, high, _mm512_set1_epi32(four_bytes(a[t] + at + 4)));
      }
    }
  }
  for (int t = 0; t < TILE; ++t) {
    __m512i dot = sums[t][0];
    for (int c = 1; c < kSums; ++c) dot = _mm512_add_epi32(dot, sums[t][c]);
    dots[t] = {dot};
  }
}

#else  // AVX2: lanes 0..7 in lo, 8..15 in hi

struct Floats { __m256 lo, hi; };
struct Ints { __m256i lo, hi; };

inline Floats zeros() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline Floats splat(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline Floats load_floats(const float* x) { return {_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)}; }

inline __m256 eight_bfloat16(const at::BFloat16* x) {  // bfloat16 is float32's upper half
  const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
}
inline Floats load_floats(const at::BFloat16* x) { return {eight_bfloat16(x), eight_bfloat16(x + 8)}; }

inline __m256 eight_half(const at::Half* x) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x))); }
inline Floats load_floats(const at::Half* x) { return {eight_half(x), eight_half(x + 8)}; }

inline void store_floats(float* out, Floats x) {
  _mm256_storeu_ps(out, x.lo);
  _mm256_storeu_ps(out + 8, x.hi);
}

// rounded to nearest even as torch's float -> bfloat16 (NaN stays a quiet NaN)
inline __m128i eight_bfloat16_bits(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7FFF))), 16);
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded), _mm256_extracti128_si256(rounded, 1));  // all < 2^16
}
inline void store_floats(at::BFloat16* out, Floats x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_set_m128i(eight_bfloat16_bits(x.hi), eight_bfloat16_bits(x.lo)));
}

inline Floats operator+(Floats a, Floats b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline Floats operator-(Floats a, Floats b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline Floats operator*(Floats a, Floats b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline Floats fmadd(Floats a, Floats b, Floats c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline Floats fnmadd(Floats a, Floats b, Floats c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline Floats maximum(Floats a, Floats b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline Floats absolute(Floats a) {
  const __m256 sign_off = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  return {_mm256_and_ps(a.lo, sign_off), _mm256_and_ps(a.hi, sign_off)};
}
inline Floats round_to_integer(Floats a) {
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(a.lo, kNearest), _mm256_round_ps(a.hi, kNearest)};
}
inline __m256 power_of_two(__m256 n) {  // 2^n, n integral in -126..127: the exponent field alone
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
inline Floats times_power_of_two(Floats p, Floats n) {
  return {_mm256_mul_ps(p.lo, power_of_two(n.lo)), _mm256_mul_ps(p.hi, power_of_two(n.hi))};
}
inline Floats zero_where_below(Floats value, Floats x, float bound) {
  const __m256 limit = _mm256_set1_ps(bound);
  return {_mm256_andnot_ps(_mm256_cmp_ps(x.lo, limit, _CMP_LT_OQ), value.lo),
          _mm256_andnot_ps(_mm256_cmp_ps(x.hi, limit, _CMP_LT_OQ), value.hi)};
}
inline float sum_of(Floats x) { return sum_of_eight(_mm256_add_ps(x.hi, x.lo)); }
inline float largest_of(Floats x) { return largest_of_eight(_mm256_max_ps(x.hi, x.lo)); }

inline Ints zero_ints() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline Ints operator+(Ints a, Ints b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline Ints to_ints(Floats a) { return {_mm256_cvtps_epi32(a.lo), _mm256_cvtps_epi32(a.hi)}; }  // to nearest even
inline Floats to_floats(Ints a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline int32_t sum_of(Ints x) { return sum_of_eight(_mm256_add_epi32(x.hi, x.lo)); }
inline void store_int8(int8_t* out, Ints x) {  // saturated; the packs interleave 128-bit halves, the permute undoes it
  const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(x.lo, x.hi), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packs_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1)));
}

// one group's int32 dot products for TILE rows (as the AVX512 build's). Without VNNI: maddubs
// multiplies unsigned weights by signed activations into int16 pair sums (at most 2 * 15 * 128,
// so low and high nibbles' add without saturating), madd with ones widens them to the 4-input
// int32 sums vpdpbusd gives. One sum a row and half: 16 registers hold no more.
// The weights 2 KB ahead are prefetched: on the AVX2 EPYC (memory shared with other tenants) a
// 1.5B model's steps of 1 to 5 tokens took 1.02-1.27x as long without it (never out of bounds:
// a prefetch does not fault).
constexpr int64_t kPrefetchAhead = 2048;
template <int TILE>
__attribute__((always_inline)) inline void group_dots(const uint8_t* weights, const int8_t* const* a,
                                                      int64_t group_size, Ints* dots) {
  const __m256i low_mask = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int t = 0; t < TILE; ++t) dots[t] = zero_ints();
  for (int64_t at = 0; at < group_size; at += kChunk) {
    const uint8_t* chunk = weights + at * kLanes / 2;
    _mm_prefetch(reinterpret_cast<const char*>(chunk + kPrefetchAhead), _MM_HINT_T0);
    const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));  // outputs 0..7
    const __m256i second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32));  // 8..15
    const __m256i low_first = _mm256_and_si256(first, low_mask);
    const __m256i high_first = _mm256_and_si256(_mm256_srli_epi16(first, 4), low_mask);
    const __m256i low_second = _mm256_and_si256(second, low_mask);
    const __m256i high_second = _mm256_and_si256(_mm256_srli_epi16(second, 4), low_mask);
    for (int t = 0; t < TILE; ++t) {
      const __m256i low_inputs = _mm256_set1_epi32(four_bytes(a[t] + at));
      const __m256i high_inputs = _mm256_set1_epi32(four_bytes(a[t] + at + 4));
      const __m256i pairs_first = _mm256_add_epi16(_mm256_maddubs_epi16(low_first, low_inputs),
                                                   _mm256_maddubs_epi16(high_first, high_inputs));
      const __m256i pairs_second = _mm256_add_epi16(_mm256_maddubs_epi16(low_second, low_inputs),
                                                    _mm256_maddubs_epi16(high_second, high_inputs));
      dots[t].lo = _mm256_add_epi32(dots[t].lo, _mm256_madd_epi16(pairs_first, ones));
      dots[t].hi = _mm256_add_epi32(dots[t].hi, _mm256_madd_epi16(pairs_second, ones));
    }
  }
}

#endif

// --------------------------------------------------------------------------- int4 x int8

struct QuantizedRows {
  std::vector<int8_t> values;      // [M, K]
  std::vector<float> scales;       // [M]
  std::vector<float> group_sums;   // [M, K / group_size]: what each group's minimum multiplies
};

// each row to int8 with one scale; K and group_size are multiples of 16
template <typename T>
QuantizedRows quantize_rows(const T* x, int64_t M, int64_t K, int64_t group_size) {
  const int64_t groups = K / group_size;
  QuantizedRows rows{std::vector<int8_t>(M * K), std::vector<float>(M), std::vector<float>(M * groups)};
  for (int64_t m = 0; m < M; ++m) {
    const T* row = x + m * K;
    Floats amax = zeros();
    Floats probe = zeros();  // stays 0 unless the row holds a NaN or an infinity (x * 0)
    for (int64_t k = 0; k < K; k += 16) {
      const Floats v = load_floats(row + k);
      amax = maximum(amax, absolute(v));
      probe = probe + v * zeros();
    }
    const float largest = largest_of(amax);
    // max drops NaNs: a row that holds one gives NaN outputs, as a float matmul would
    const float scale = std::isnan(sum_of(probe)) ? NAN : largest > 0.f ? largest / 127.f : 1.f;
    const Floats inverse = splat(1.f / scale);
    rows.scales[m] = scale;
    for (int64_t g = 0; g < groups; ++g) {
      Ints sum = zero_ints();
      for (int64_t k = g * group_size; k < (g + 1) * group_size; k += 16) {
        // round to nearest even, as nearbyint; |x| / scale <= 127 so nothing saturates
        const Ints q = to_ints(load_floats(row + k) * inverse);
        store_int8(rows.values.data() + m * K + k, q);
        sum = sum + q;
      }
      rows.group_sums[m * groups + g] = static_cast<float>(sum_of(sum));
    }
  }
  return rows;
}

// rows [m0, m0 + TILE) of outputs [n0, n0 + 16)
template <int TILE, typename Out>
void output_tile(const QuantizedRows& rows, int64_t m0, int64_t K, int64_t group_size, const uint8_t* weights,
                 const at::Half* scales, const at::Half* mins, const float* bias, Out* out, int64_t N, int64_t n0) {
  const int64_t groups = K / group_size;
  Floats acc[TILE];
  for (int t = 0; t < TILE; ++t) acc[t] = zeros();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* a[TILE];
    for (int t = 0; t < TILE; ++t) a[t] = rows.values.data() + (m0 + t) * K + g * group_size;
    Ints dots[TILE];
    group_dots<TILE>(weights + g * group_size * kLanes / 2, a, group_size, dots);
    const Floats scale = load_floats(scales + g * kLanes);
    const Floats minimum = load_floats(mins + g * kLanes);
    for (int t = 0; t < TILE; ++t) {
      acc[t] = fmadd(to_floats(dots[t]), scale, acc[t]);
      acc[t] = fmadd(minimum, splat(rows.group_sums[(m0 + t) * groups + g]), acc[t]);
    }
  }
  const Floats shift = bias ? load_floats(bias + n0) : zeros();
  for (int t = 0; t < TILE; ++t) store_floats(out + (m0 + t) * N + n0, fmadd(acc[t], splat(rows.scales[m0 + t]), shift));
}

template <typename Out>
void output_block(const QuantizedRows& rows, int64_t M, int64_t K, int64_t group_size, const uint8_t* weights,
                  const at::Half* scales, const at::Half* mins, const float* bias, Out* out, int64_t N, int64_t n0) {
  int64_t m = 0;
  for (; m + kRowsTile <= M; m += kRowsTile)
    output_tile<kRowsTile, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0);
  switch (M - m) {  // the rows left, fewer than kRowsTile
#if defined(__AVX512F__)
    case 7: output_tile<7, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    case 6: output_tile<6, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    case 5: output_tile<5, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    case 4: output_tile<4, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
#endif
    case 3: output_tile<3, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    case 2: output_tile<2, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    case 1: output_tile<1, Out>(rows, m, K, group_size, weights, scales, mins, bias, out, N, n0); break;
    default: break;
  }
}

template <typename Out>
void all_blocks(const QuantizedRows& rows, int64_t M, int64_t K, int64_t group_size, const at::Tensor& packed,
                const at::Tensor& scales, const at::Tensor& mins, const float* bias, Out* out, int64_t N) {
  const int64_t groups = K / group_size;
  const uint8_t* weight = packed.data_ptr<uint8_t>();
  const at::Half* scale_data = scales.data_ptr<at::Half>();
  const at::Half* min_data = mins.data_ptr<at::Half>();
  at::parallel_for(0, packed.size(0), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      output_block(rows, M, K, group_size, weight + b * K * kLanes / 2, scale_data + b * groups * kLanes,
                   min_data + b * groups * kLanes, bias, out, N, b * kLanes);
    }
  });
}

// x [M, K] float32 or bfloat16, contiguous -> out's first M rows [M, N], x's dtype
void multiply_rows(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales, const at::Tensor& mins,
                   int64_t group_size, const at::Tensor& bias, at::Tensor& out) {
  const int64_t M = x.size(0), K = x.size(1), N = packed.size(0) * kLanes;
  const float* bias_data = bias.numel() ? bias.data_ptr<float>() : nullptr;
  if (x.scalar_type() == at::kBFloat16) {
    const QuantizedRows rows = quantize_rows(x.data_ptr<at::BFloat16>(), M, K, group_size);
    all_blocks(rows, M, K, group_size, packed, scales, mins, bias_data, out.data_ptr<at::BFloat16>(), N);
  } else {
    const QuantizedRows rows = quantize_rows(x.data_ptr<float>(), M, K, group_size);
    all_blocks(rows, M, K, group_size, packed, scales, mins, bias_data, out.data_ptr<float>(), N);
  }
}

}  // namespace

// x [..., K] (any float dtype), packed [N / 16, K / 8, 64] uint8, scales and mins [N / 16,
// K / group_size, 16] float16, bias [N] float32 or empty; returns [..., N] in x's dtype (written
// directly for bfloat16 and float32: a conversion after the call cost a copy a layer).
// A row equal, bit for bit, to the row before it is computed once: a 1-token step runs padded to
// two rows, and its pad repeats the token (static.py), so this spares the pad's arithmetic (a
// second row cost 7-24% more than one on AVX2). Exact: each row's result depends on it alone.
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scales,
                          const at::Tensor& mins, int64_t group_size, const at::Tensor& bias) {
  TORCH_CHECK(x.device().is_cpu(), "int4_linear: CPU tensors only");
  const int64_t K = x.size(-1);
  const int64_t N = packed.size(0) * kLanes;
  TORCH_CHECK(group_size % 16 == 0 && K % group_size == 0, "int4_linear: group_size must be a multiple of 16 dividing K");
  TORCH_CHECK(packed.size(1) * kChunk == K, "int4_linear: weight and input widths differ");
  TORCH_CHECK(scales.scalar_type() == at::kHalf && mins.scalar_type() == at::kHalf, "int4_linear: scales and mins must be float16");
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  const at::Tensor x2 = (bf16 ? x : x.to(at::kFloat)).reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  const int64_t row_bytes = K * x2.element_size();
  const char* rows_in = static_cast<const char*>(x2.data_ptr());
  std::vector<int64_t> distinct;   // the first row of each run of equal rows
  std::vector<int64_t> run_of(M);  // each row's run
  for (int64_t m = 0; m < M; ++m) {
    if (m == 0 || std::memcmp(rows_in + m * row_bytes, rows_in + (m - 1) * row_bytes, row_bytes) != 0) distinct.push_back(m);
    run_of[m] = static_cast<int64_t>(distinct.size()) - 1;
  }
  const int64_t D = static_cast<int64_t>(distinct.size());
  at::Tensor out = at::empty({M, N}, x2.options());
  if (D == M) {
    multiply_rows(x2, packed, scales, mins, group_size, bias, out);
  } else {  // the distinct rows' results into out's first D rows, then spread from the last row down
    at::Tensor compact = at::empty({D, K}, x2.options());
    char* compact_rows = static_cast<char*>(compact.data_ptr());
    for (int64_t d = 0; d < D; ++d) std::memcpy(compact_rows + d * row_bytes, rows_in + distinct[d] * row_bytes, row_bytes);
    multiply_rows(compact, packed, scales, mins, group_size, bias, out);
    const int64_t out_bytes = N * out.element_size();
    char* rows_out = static_cast<char*>(out.data_ptr());
    for (int64_t m = M - 1; m >= 0; --m)  // run_of[m] <= m: the row read is not yet overwritten
      if (run_of[m] != m) std::memcpy(rows_out + m * out_bytes, rows_out + run_of[m] * out_bytes, out_bytes);
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = N;
  return out.to(x.scalar_type()).reshape(shape);  // float16 and others: computed in float32
}

// --------------------------------------------------------------------------- attention
// A verify's attention: n query rows (a decode step, a draft, a tree) against a static cache of
// C slots under an additive mask. ATen's CPU SDPA (flash) cost ~100 us a layer for 2 rows and 256
// slots whatever the work, 4 ms of a 1.5B model's step. Here each query row is one task: its
// scores, a softmax and the weighted sum of values in float32, in a fixed order, so a row's output
// never depends on the other rows of the call (the exactness the int4 kernel keeps too); slots the
// mask shuts (its dtype's minimum) are skipped, which is exact: their weight is 0 in float.
// A row that repeats the one before it (a 1-token step's pad) is copied, not computed again.

namespace {

constexpr float kShut = -1e30f;  // masks shut a slot with the dtype's minimum (-3.4e38)

// e^x for x <= 0 (Cody-Waite reduction and a degree-6 polynomial, ~2 ulp); -inf gives 0
inline Floats exp_nonpositive(Floats x) {
  const Floats clamped = maximum(x, splat(-87.3f));
  const Floats n = round_to_integer(clamped * splat(1.44269504088896341f));
  Floats r = fnmadd(n, splat(0.693359375f), clamped);
  r = fnmadd(n, splat(-2.12194440e-4f), r);
  Floats p = splat(1.9875691500e-4f);
  p = fmadd(p, r, splat(1.3981999507e-3f));
  p = fmadd(p, r, splat(8.3334519073e-3f));
  p = fmadd(p, r, splat(4.1665795894e-2f));
  p = fmadd(p, r, splat(1.6666665459e-1f));
  p = fmadd(p, r, splat(5.0000001201e-1f));
  p = fmadd(p, r * r, r + splat(1.f));
  return zero_where_below(times_power_of_two(p, n), x, -87.3f);
}

template <typename T>
void attend_row(const T* q, const T* k, const T* v, const T* mask, int64_t C, int64_t D, int64_t slot_stride,
                float scale, T* out, std::vector<float>& scores) {
  scores.resize(C + 16);
  const int64_t chunks = D / 16;
  Floats query[16];  // D <= 256
  for (int64_t c = 0; c < chunks; ++c) query[c] = load_floats(q + 16 * c) * splat(scale);
  float largest = -INFINITY;
  for (int64_t j = 0; j < C; ++j) {
    const float shift = static_cast<float>(mask[j]);
    if (shift < kShut) { scores[j] = -INFINITY; continue; }
    const T* key = k + j * slot_stride;
    Floats dot = query[0] * load_floats(key);
    for (int64_t c = 1; c < chunks; ++c) dot = fmadd(query[c], load_floats(key + 16 * c), dot);
    scores[j] = sum_of(dot) + shift;
    largest = std::max(largest, scores[j]);
  }
  for (int64_t j = C; j < C + 16; ++j) scores[j] = -INFINITY;
  const Floats top = splat(largest);
  for (int64_t j = 0; j < C; j += 16)
    store_floats(scores.data() + j, exp_nonpositive(load_floats(scores.data() + j) - top));
  Floats acc[16];
  for (int64_t c = 0; c < chunks; ++c) acc[c] = zeros();
  float total = 0.f;
  for (int64_t j = 0; j < C; ++j) {
    const float weight = scores[j];
    if (weight == 0.f) continue;  // shut, or too small to count in float
    total += weight;
    const Floats w = splat(weight);
    const T* value = v + j * slot_stride;
    for (int64_t c = 0; c < chunks; ++c) acc[c] = fmadd(w, load_floats(value + 16 * c), acc[c]);
  }
  const Floats inverse = splat(1.f / total);
  for (int64_t c = 0; c < chunks; ++c) store_floats(out + 16 * c, acc[c] * inverse);
}

// Batch b's mask row `row` (a mask of batch 1 serves every batch).
template <typename T>
const T* mask_row(const at::Tensor& mask, int64_t b, int64_t row) {
  return mask.data_ptr<T>() + (mask.size(0) > 1 ? b * mask.stride(0) : 0) + row * mask.stride(2);
}

// Whether query row `row` of batch b repeats the row before it: the same mask row and, in every
// head, the same query (a 1-token step's pad, static.py), so its output is that row's.
template <typename T>
bool repeats_row_before(const at::Tensor& q, const at::Tensor& mask, int64_t b, int64_t row) {
  if (row == 0) return false;
  if (std::memcmp(mask_row<T>(mask, b, row), mask_row<T>(mask, b, row - 1), mask.size(3) * sizeof(T)) != 0) return false;
  const T* qb = q.data_ptr<T>() + b * q.stride(0);
  for (int64_t h = 0; h < q.size(1); ++h) {
    const T* head = qb + h * q.stride(1);
    if (std::memcmp(head + row * q.stride(2), head + (row - 1) * q.stride(2), q.size(3) * sizeof(T)) != 0) return false;
  }
  return true;
}

template <typename T>
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask, float scale,
            at::Tensor& out) {
  const int64_t B = q.size(0), H = q.size(1), n = q.size(2), D = q.size(3), Hkv = k.size(1), C = k.size(2);
  const int64_t group = H / Hkv;
  const T* qd = q.data_ptr<T>();
  const T* kd = k.data_ptr<T>();
  const T* vd = v.data_ptr<T>();
  T* od = out.data_ptr<T>();
  std::vector<int64_t> tasks;  // (b, h, row) as b * H * n + h * n + row, rows that repeat the one before left out
  std::vector<std::pair<int64_t, int64_t>> repeated;  // (b, row), in order: copied after the tasks
  tasks.reserve(B * H * n);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t row = 0; row < n; ++row) {
      if (repeats_row_before<T>(q, mask, b, row)) { repeated.emplace_back(b, row); continue; }
      for (int64_t h = 0; h < H; ++h) tasks.push_back(b * H * n + h * n + row);
    }
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t task = tasks[i];
      const int64_t b = task / (H * n), h = (task / n) % H, row = task % n;
      const int64_t kv_offset = b * k.stride(0) + (h / group) * k.stride(1);
      attend_row(qd + b * q.stride(0) + h * q.stride(1) + row * q.stride(2), kd + kv_offset,
                 vd + b * v.stride(0) + (h / group) * v.stride(1), mask_row<T>(mask, b, row), C, D, k.stride(2), scale,
                 od + b * out.stride(0) + h * out.stride(1) + row * out.stride(2), scores);
    }
  });
  for (const auto& [b, row] : repeated)  // in row order: the row before is final when it is read
    for (int64_t h = 0; h < H; ++h) {
      T* head = od + b * out.stride(0) + h * out.stride(1);
      std::memcpy(head + row * out.stride(2), head + (row - 1) * out.stride(2), D * sizeof(T));
    }
}

}  // namespace

// q [B, H, n, D], k and v [B, Hkv, C, D], mask [B or 1, 1, n, C] additive, all float32 or all
// bfloat16 with the last dimension contiguous; D a multiple of 16 up to 256, H a multiple of Hkv.
// Returns [B, H, n, D] in q's dtype.
at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            double scale) {
  TORCH_CHECK(q.device().is_cpu() && q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && mask.dim() == 4,
              "masked_attention: 4D CPU tensors only");
  TORCH_CHECK(q.size(3) % 16 == 0 && q.size(3) <= 256 && q.size(1) % k.size(1) == 0, "masked_attention: unsupported head shape");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && k.scalar_type() == v.scalar_type() && v.scalar_type() == mask.scalar_type()
              && (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16), "masked_attention: float32 or bfloat16, one dtype");
  TORCH_CHECK(k.stride(3) == 1 && v.stride(3) == 1 && k.strides() == v.strides(), "masked_attention: keys and values laid out alike");
  TORCH_CHECK(mask.size(1) == 1 && mask.size(2) == q.size(2) && mask.size(3) == k.size(2) && mask.stride(3) == 1,
              "masked_attention: mask must be [B or 1, 1, n, C]");
  const at::Tensor query = q.stride(3) == 1 ? q : q.contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options());
  if (q.scalar_type() == at::kBFloat16) attend<at::BFloat16>(query, k, v, mask, static_cast<float>(scale), out);
  else attend<float>(query, k, v, mask, static_cast<float>(scale), out);
  return out;
}

TORCH_LIBRARY(specdec_kernels, library) {
  library.def("int4_linear(Tensor x, Tensor packed, Tensor scales, Tensor mins, int group_size, Tensor bias) -> Tensor");
  library.def("masked_attention(Tensor q, Tensor k, Tensor v, Tensor mask, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(specdec_kernels, CPU, library) {
  library.impl("int4_linear", &int4_linear);
  library.impl("masked_attention", &masked_attention);
}
