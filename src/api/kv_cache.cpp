// plan_kv_cache(): a KV cache call's number of splits and workspace, from
// its sizes alone (fwd/kv_workspace.h), on the current device.
#include <string>

#include "api/checks.h"
#include "api/device.h"
#include "flash3/flash3.h"
#include "fwd/kv_split.h"
#include "fwd/kv_workspace.h"

namespace flash3 {

Status plan_kv_cache(ForwardArgs const& a, KvCachePlan* plan) {
  if (plan == nullptr) return checks::invalid("plan: null pointer");
  *plan = KvCachePlan{};
  if (Status s = checks::attention_sizes(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim,
                                        a.head_dim_v,
                                        a.qv.data != nullptr || mla_head_dims(a.head_dim, a.head_dim_v));
      !s.ok()) {
    return s;
  }
  KvCache const& c = a.kv_cache;
  if (c.seqlens == nullptr) return checks::invalid("kv_cache.seqlens: null pointer (plan_kv_cache plans a KV cache call)");
  if (Status s = checks::num_splits(a.batch, a.seqlen_q, a.heads_q, c.num_splits, kMaxSplits); !s.ok()) return s;
  if (c.append.seqlen_new < 0 || c.append.seqlen_new > a.seqlen_k) {
    return checks::invalid("kv_cache.append.seqlen_new: must be in [0, seqlen_k] (" + std::to_string(a.seqlen_k) +
                           "), got " + std::to_string(c.append.seqlen_new));
  }
  if (a.batch == 0 || a.seqlen_q == 0) return Status();  // forward() launches nothing
  int num_sms = 0;  // read only by the choice for num_splits 0
  if (c.num_splits == 0) {
    DeviceInfo device;
    if (Status s = query_device(device); !s.ok()) return s;
    num_sms = device.num_sms;
  }
  int const splits = fwd::num_splits_of(a, num_sms);
  plan->num_splits = splits;
  plan->workspace_bytes = fwd::kv_workspace_layout(a, splits).bytes;
  return Status();
}

}  // namespace flash3
