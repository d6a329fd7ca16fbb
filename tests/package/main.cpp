// Calls flash3 with an unsupported head dim: it must compile, link, and
// report the argument without touching a GPU.
#include <flash3/flash3.h>

#include <cstdio>

int main() {
  flash3::ForwardArgs args;
  args.batch = 1;
  args.seqlen_q = args.seqlen_k = 1;
  args.heads_q = args.heads_kv = 1;
  args.head_dim = 100;
  flash3::Status const s = flash3::forward(args, nullptr);
  std::printf("flash3::forward: %s\n", s.message().c_str());
  return s.code() == flash3::Status::Code::kInvalidArgument ? 0 : 1;
}
