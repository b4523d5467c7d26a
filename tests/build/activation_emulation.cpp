// Host emulation of templates/activations.h's functors: reads float32 values from
// argv[2], writes each functor's float32 results to argv[3] (one block per functor).
#include <cstdio>
#include <vector>
#include ACTIVATIONS_HEADER

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) return 3;
  std::vector<float> x;
  float v;
  while (std::fread(&v, sizeof v, 1, in) == 1) x.push_back(v);
  std::fclose(in);
  std::vector<float> y(x.size());
  // the Array form CUTLASS's epilogues call, then the scalar one for the tail
  co_act::GELU<cutlass::Array<float, 4>> gelu4;
  co_act::GELU<float> gelu;
  size_t i = 0;
  for (; i + 4 <= x.size(); i += 4) {
    cutlass::Array<float, 4> a;
    for (int j = 0; j < 4; ++j) a[j] = x[i + j];
    cutlass::Array<float, 4> b = gelu4(a);
    for (int j = 0; j < 4; ++j) y[i + j] = b[j];
  }
  for (; i < x.size(); ++i) y[i] = gelu(x[i]);
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 5;
}
