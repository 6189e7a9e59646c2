# KV transfer messages (kvtransfer/, docs/kvtransfer.md).
#
# Two planes use these:
#   * control plane (out of band, ZeroMQ in tests and benches): KvDescriptor travels from the
#     decode worker to every prefill rank that may write into its blocks.
#   * transfer plane (UCX active messages on the same endpoint as the one-sided writes):
#     TransferMessage (begin / complete / abort / ack) between one prefill rank and one decode
#     worker. A `complete` is sent only after the writes it covers were flushed.
# All integers are little-endian Cap'n Proto fields; addresses are the decode process's virtual
# addresses, meaningful only together with the region's packed remote key.
@0xfafc3520105c4cf9;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("pdserve::proto");

enum LatentFormat {
  bf16 @0;          # kv_lora_rank BF16 values, no scale
  fp8Blockwise @1;  # kv_lora_rank FP8 E4M3 codes + one fp32 scale per scale group
  int8PerToken @2;  # kv_lora_rank INT8 codes + one fp32 scale ("C8")
}

enum IndexerFormat {
  fp8 @0;   # index_head_dim FP8 E4M3 codes + one fp32 scale
  int8 @1;  # index_head_dim INT8 codes + one fp32 scale
}

# KvLayout: the byte layout of one paged block (see common/kv_layout.h).
struct KvLayout {
  numLayers @0 :UInt32;
  kvLoraRank @1 :UInt32;
  qkRopeHeadDim @2 :UInt32;
  indexHeadDim @3 :UInt32;
  tokensPerBlock @4 :UInt32;
  latentFormat @5 :LatentFormat;
  indexerFormat @6 :IndexerFormat;
  latentScaleGroup @7 :UInt32;  # values per fp32 scale for fp8Blockwise
}

# A registered memory region of the decode worker.
struct RemoteRegion {
  baseAddress @0 :UInt64;
  length @1 :UInt64;
  packedKey @2 :Data;  # transport-specific remote key (UCX: ucp_rkey_pack output)
}

struct TokenRange {
  begin @0 :UInt32;  # first token (inclusive)
  end @1 :UInt32;    # one past the last token
}

# Which prefill rank writes which tokens. Ranges of different writers never overlap and
# together cover [0, numTokens): exactly one rank writes each token.
struct WriterAssignment {
  rank @0 :UInt32;
  ranges @1 :List(TokenRange);
}

# Where the KV of one request goes: built by the decode worker when it reserves blocks.
struct KvDescriptor {
  requestId @0 :UInt64;
  decodeAddress @1 :Data;     # transport address of the decode worker
  layout @2 :KvLayout;        # decode-side layout (its tokensPerBlock)
  region @3 :RemoteRegion;    # every block lies inside this region
  numTokens @4 :UInt32;
  blockIds @5 :List(UInt32);  # block i holds tokens [i*B, (i+1)*B)
  blockAddresses @6 :List(UInt64);
  writers @7 :List(WriterAssignment);
  transferTimeoutMs @8 :UInt32;  # budget from a writer's `begin` to the decode's ack
  verifyDigest @9 :Bool;
  leaseExpiryUnixMs @10 :Int64;  # wall clock; a writer must not begin after it
}

# Control plane: a prefill rank asks a decode worker for the descriptor of a request.
struct DescriptorRequest {
  requestId @0 :UInt64;
  rank @1 :UInt32;
  numTokens @2 :UInt32;  # 0: the decode side already knows the request's length
}

struct DescriptorReply {
  union {
    descriptor @0 :KvDescriptor;
    failure @1 :Failure;
  }
}

# Transfer-plane message between one prefill rank and one decode worker.
struct TransferMessage {
  requestId @0 :UInt64;
  rank @1 :UInt32;           # the prefill rank concerned
  senderAddress @2 :Data;    # transport address of the sender (to reply)
  union {
    begin @3 :Void;          # prefill -> decode: writes start now
    complete @4 :Completion; # prefill -> decode: all writes of `rank` are flushed
    abort @5 :Failure;       # either way: give up this request
    ack @6 :Failure;         # decode -> prefill: verdict on `complete`/`abort` (code 0 = OK)
  }
  deadlineUnixMs @7 :Int64;  # begin/complete: the writer gives up at this wall-clock time
}

struct Completion {
  blocksWritten @0 :UInt32;  # distinct decode blocks this rank wrote into
  bytesWritten @1 :UInt64;
  digest @2 :UInt64;         # kvtransfer digest of the written bytes (XXH3-64 based)
}

struct Failure {
  code @0 :UInt32;           # pdserve::StatusCode
  message @1 :Text;
}
