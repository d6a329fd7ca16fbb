// Packed sequences (varlen) in the backward kernels: a sequence's lengths
// and offsets, from the device arrays (common/varlen_tiles.h's
// SequenceLengths). The main kernel reads them once per CTA into a slot of
// shared memory (BwdTraits::SharedStorage::sequence), where every role reads
// them when needed: held in registers across the mainloop they would cost
// the consumers' GEMMs theirs.
#pragma once

#include "bwd/workspace.h"
#include "common/host_device.h"
#include "common/varlen_tiles.h"

namespace flash3::bwd {

// The slot's entries.
enum SequenceField : int {
  kSeqQ = 0,        // query rows that take part (seqused_q, or the packed length)
  kSeqK = 1,        // keys that take part
  kLenK = 2,        // packed keys: dK and dV rows written (zeros past kSeqK)
  kFirstQ = 3,      // the sequence's first packed query row
  kFirstK = 4,      // its first packed key row
  kFirstBlock = 5,  // its first block of the workspace's rows (packed_first_block)
  kSequenceFields = 6,
};

// Packed lengths (rows written), as opposed to SequenceLengths' rows that take part.
FLASH3_HOST_DEVICE int packed_len_q(SequenceLengths const& l, int b) { return l.cu_seqlens_q[b + 1] - l.cu_seqlens_q[b]; }
FLASH3_HOST_DEVICE int packed_len_k(SequenceLengths const& l, int b) { return l.cu_seqlens_k[b + 1] - l.cu_seqlens_k[b]; }

FLASH3_HOST_DEVICE void read_sequence(int* slot, SequenceLengths const& l, int b, int block_m) {
  slot[kSeqQ] = l.q(b);
  slot[kSeqK] = l.k(b);
  slot[kLenK] = packed_len_k(l, b);
  slot[kFirstQ] = l.cu_seqlens_q[b];
  slot[kFirstK] = l.cu_seqlens_k[b];
  slot[kFirstBlock] = int(packed_first_block(l.cu_seqlens_q[b], b, block_m));
}

// The sequence whose workspace blocks hold block `block` of a head's rows
// (the last b with packed_first_block(b) <= block; blocks past the last
// sequence's fall to it), by binary search over cu_seqlens_q.
FLASH3_HOST_DEVICE int sequence_of_block(SequenceLengths const& l, int batch, int block, int block_m) {
  int lo = 0, hi = batch - 1;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    if (packed_first_block(l.cu_seqlens_q[mid], mid, block_m) <= block) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// sequence_of_block(block) from the sequence of an earlier block: a step a
// sequence, where the blocks between are few (a thread's rows of the
// preprocess go up by fewer blocks than a search over the batch takes loads).
FLASH3_HOST_DEVICE int advance_to_block(SequenceLengths const& l, int batch, int b, int block, int block_m) {
  while (b + 1 < batch && packed_first_block(l.cu_seqlens_q[b + 1], b + 1, block_m) <= block) ++b;
  return b;
}

// The backward preprocess's item `item` with packed sequences: its head and
// chunk (its rows of the head, from chunk * kPreprocessItemRows). The main
// kernel's CTAs come sequence by sequence, a sequence's head by head: the
// chunks whose first block is sequence b's (b's run) come after b - 1's,
// head by head. A chunk's later rows may be the next sequences': done
// before those need them.
struct PackedItem {
  int head;
  int chunk;
};
FLASH3_HOST_DEVICE PackedItem packed_item(SequenceLengths const& l, int batch, int heads, int items_per_head, int item,
                                          int block_m) {
  int const blocks = kPreprocessItemRows / block_m;  // a chunk's
  auto run_begin = [&](int b) {
    return b < batch ? int((packed_first_block(l.cu_seqlens_q[b], b, block_m) + blocks - 1) / blocks) : items_per_head;
  };
  int const b = sequence_of_block(l, batch, item / heads * blocks, block_m);
  int const begin = run_begin(b), chunks = run_begin(b + 1) - begin;
  int const offset = item - begin * heads;
  return {offset / chunks, begin + offset % chunks};
}

}  // namespace flash3::bwd
