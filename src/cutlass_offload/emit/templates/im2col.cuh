// cutlass_offload: the im2col pack kernel of convs lowered onto the sm90 GEMM
// (emit/conv_gemm_sm90.py, families/conv_gemm_sm90.py), hand-written CUDA. Inlined
// once into each translation unit that holds such a conv, after the CUTLASS
// includes; templates only, so an instantiation in two objects of one library
// links once.
#ifndef CO_IM2COL_COMMON_
#define CO_IM2COL_COMMON_
namespace co_im2col {

// One conv (CoConvArgs' sizes) and the chunk of im2col rows to pack.
struct Geometry {
  int64_t n, h, w, c, k, r, s, p, q;
  int64_t pad_h, pad_w, stride_h, stride_w, dilation_h, dilation_w;
  int64_t kp;        // row length of A and B: r*s*c rounded up to 8
  int64_t row0;      // first output pixel (GEMM row) of this chunk
  int64_t rows;      // output pixels in this chunk
  int64_t b_rows;    // filter rows to pack into B as well (k, or 0)
};

// A[i, (r, s, c)] = x[n, p*stride_h - pad_h + r*dilation_h, q*stride_w - pad_w + s*dilation_w, c]
// for output pixel (n, p, q) = row0 + i, zero outside the image and in the columns
// past r*s*c; B[k, j] = filter[k, j] for j < r*s*c, else zero (KRSC flattened).
// Element copies only, so inf / NaN reach exactly the outputs whose window holds
// them. A and B rows are kp long (kp % 8 == 0), 16-byte aligned.
//
// Thread order: each thread writes 8 consecutive columns (one 16-byte store); two
// neighbouring threads the 16 columns of one 32-byte sector; the next pair the same
// columns of the next row. So a warp stores 16 whole sectors, and its element loads
// walk 16 neighbouring output pixels, whose windows overlap in x: a few cache lines
// per load instead of one per lane (a thread per 8 columns of one row read ~20 lines
// per load and ran the ResNet-50 stem's pack at 49 us for 30.5 MB, H200).
template <typename T>
__global__ void __launch_bounds__(256) pack(const T* __restrict__ x, const T* __restrict__ filter,
                                            T* __restrict__ a, T* __restrict__ b, Geometry g) {
  static_assert(sizeof(T) == 2, "16-bit elements: 8 per 16-byte store");
  // 32-bit index math (the launcher checks that every value here fits): the pack is
  // bound by integer instructions, not memory (64-bit math per element ran the
  // ResNet-50 stem's 30.5 MB pack at 49 us on an H200)
  const int chunks = int(g.kp / 8);
  const int pairs = (chunks + 1) / 2;
  const int rows = int(g.rows + g.b_rows);
  const int total = rows * pairs * 2;
  const int rsc = int(g.r * g.s * g.c);
  const int sc = int(g.s * g.c), cc = int(g.c), qq = int(g.q), pq = int(g.p * g.q);
  const int H = int(g.h), W = int(g.w), ss = int(g.s), dh = int(g.dilation_h), dw = int(g.dilation_w);
  for (int t = blockIdx.x * blockDim.x + threadIdx.x; t < total; t += gridDim.x * blockDim.x) {
    const int unit = t >> 1;
    const int pair = unit / rows;
    const int row = unit - pair * rows;
    const int chunk = pair * 2 + (t & 1);
    if (chunk >= chunks) continue;
    const int col0 = chunk * 8;
    alignas(16) T v[8];
    if (row < g.rows) {
      const int pixel = int(g.row0) + row;
      const int n = pixel / pq;
      const int rest = pixel - n * pq;
      const int p = rest / qq;
      const T* image = x + int64_t(n) * g.h * g.w * g.c;
      // (r, s, c) of column col0, then stepped (c fastest, as in KRSC); the image
      // row / column (hh, ww) and the element offset in the image move with them,
      // all in 32 bits (the launcher bounds them): the per-element work is a few
      // integer adds, two unsigned compares and a predicated load
      int r = col0 / sc;
      int s = (col0 - r * sc) / cc;
      int c = col0 - r * sc - s * cc;
      const int w0 = (rest - p * qq) * int(g.stride_w) - int(g.pad_w);
      int hh = p * int(g.stride_h) - int(g.pad_h) + r * int(g.dilation_h);
      int ww = w0 + s * int(g.dilation_w);
      // unsigned: wraps harmlessly while (hh, ww) is outside the image (never read then)
      unsigned ofs = (unsigned(hh) * unsigned(W) + unsigned(ww)) * unsigned(cc) + unsigned(c);
      if ((cc & 7) == 0) {
        // C % 8 == 0 (a deep conv lowered for its few output tiles): the 8 columns are
        // 8 channels of one filter position, 16 bytes of x (the launcher checked x's
        // alignment), or 8 zeros of the padding
        uint4 vec = make_uint4(0, 0, 0, 0);
        if (unsigned(hh) < unsigned(H) && unsigned(ww) < unsigned(W)) {
          vec = *reinterpret_cast<const uint4*>(image + ofs);
        }
        *reinterpret_cast<uint4*>(a + int64_t(row) * g.kp + col0) = vec;
        continue;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        T val = T(0);
        if (col0 + e < rsc) {
          if (unsigned(hh) < unsigned(H) && unsigned(ww) < unsigned(W)) val = image[ofs];
          ++ofs;
          if (++c == cc) {
            c = 0;
            ww += dw;
            if (++s == ss) {
              s = 0;
              hh += dh;
              ww = w0;
            }
            ofs = (unsigned(hh) * unsigned(W) + unsigned(ww)) * unsigned(cc);
          }
        }
        v[e] = val;
      }
      *reinterpret_cast<uint4*>(a + int64_t(row) * g.kp + col0) = *reinterpret_cast<const uint4*>(v);
    } else {
      const int64_t k = row - g.rows;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = col0 + e < rsc ? filter[k * rsc + col0 + e] : T(0);
      *reinterpret_cast<uint4*>(b + k * g.kp + col0) = *reinterpret_cast<const uint4*>(v);
    }
  }
}

}  // namespace co_im2col
#endif  // CO_IM2COL_COMMON_
