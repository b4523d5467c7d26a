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
  co_act::GELU<float> gelu;
  for (size_t i = 0; i < x.size(); ++i) y[i] = gelu(x[i]);
  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out || std::fwrite(y.data(), sizeof(float), y.size(), out) != y.size()) return 4;
  return std::fclose(out) == 0 ? 0 : 5;
}
