#include "services/control/control_codec.h"

#include <cmath>
#include <limits>
#include <random>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include "proto/control.capnp.h"

namespace pdserve::services {
namespace {

ControlMessage RoundTrip(const ControlMessage& m) {
  auto bytes = EncodeControlMessage(m);
  EXPECT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DecodeControlMessage(bytes.value());
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  return back.value();
}

JobMsg SampleJob() {
  JobMsg j;
  j.request_id = 0xabcdef0012345678ull;
  j.request_tag = "chatcmpl-1";
  j.phase = JobPhase::kPrefill;
  j.prompt = {0, 5, 128000, 7};
  j.sampling.temperature = 0.7f;
  j.sampling.top_p = 0.9f;
  j.sampling.top_k = 40;
  j.sampling.min_p = 0.05f;
  j.sampling.repetition_penalty = 1.1f;
  j.sampling.presence_penalty = -0.5f;
  j.sampling.frequency_penalty = 0.25f;
  j.sampling.seed = 42;
  j.sampling.max_tokens = 99;
  j.sampling.resumed_output = 1;
  j.sampling.stop_token_ids = {1, 2};
  j.sampling.stop = {"\n\n", "END"};
  j.sampling.logprobs = 3;
  j.sampling.logit_bias = {{7, -100.0f}, {9, 2.5f}};
  j.constraint.kind = grammar::ConstraintKind::kJsonSchema;
  j.constraint.text = R"({"type":"object","properties":{"a":{"type":"integer"}}})";
  j.constraint.free_text_until = "</think>";
  j.constraint.json.compact = true;
  j.constraint.json.max_whitespace = 3;
  j.constraint.json.strict = false;
  j.prefill_kv_namespace = 0xfeedull;
  j.deadline_unix_ms = 1234567;
  j.dp_rank = 3;
  j.kv_descriptor = std::string("\0\x01\x02binary", 9);
  j.decode_worker_id = "d0";
  j.decode_transfer_address = std::string("\xff\x00ucx", 5);
  return j;
}

TEST(ControlCodecTest, RegisterWithADpRankOutsideItsInstanceIsRefused) {
  RegisterMsg reg;
  reg.worker_id = "decode-a-dp2";
  reg.instance_id = "decode-a";
  reg.capacity.dp_ranks = 2;
  reg.dp_rank = 2;
  auto bytes = EncodeControlMessage(reg);
  ASSERT_TRUE(bytes.ok());
  auto back = DecodeControlMessage(*bytes);
  ASSERT_FALSE(back.ok());
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("dpRank 2"), std::string::npos) << back.status().ToString();
}

TEST(ControlCodecTest, EveryMessageRoundTrips) {
  RegisterMsg reg;
  reg.role = WorkerRole::kDecode;
  reg.worker_id = "decode-0";
  reg.incarnation = 77;
  reg.control_address = "tcp://127.0.0.1:7000";
  reg.http_address = "127.0.0.1:9100";
  reg.transfer_address = std::string("\x01\x00\x02", 3);
  reg.capacity = {64, 1000, 900, 64, 8192, 2, 4096};
  reg.model_name = "m";
  reg.compat_hash = 0xdeadbeef;
  reg.instance_id = "decode-a";
  reg.dp_rank = 1;
  reg.kv_namespace = 0x1234abcd5678ef00ull;
  HeartbeatMsg hb;
  hb.seq = 9;
  hb.load = {3, 4, 500, 10, 20};
  hb.draining = true;
  TokenEventMsg ev;
  ev.request_id = 5;
  ev.first_index = 3;
  ev.tokens = {10, 11};
  ev.logprobs = {{-0.5f, {{10, -0.5f}, {12, -1.5f}}}, {-std::numeric_limits<float>::infinity(), {}}};
  ev.finish = FinishReason::kError;
  ev.error = Status::ResourceExhausted("no blocks");
  ev.prompt_tokens = 4;
  ev.completion_tokens = 5;
  ev.stop_string = "END";
  ev.constraint_state = std::string("\x00state\xff", 7);
  ev.cached_prompt_tokens = 128;

  const std::vector<ControlMessage> messages = {
      reg,
      RegisterAckMsg{1, 500, 2500},
      RegisterRefuseMsg{StatusCode::kFailedPrecondition, "hash mismatch"},
      hb,
      HeartbeatAckMsg{9, true, 1},
      SampleJob(),
      KvReservedMsg{5, std::string("desc\0x", 6), "addr", 12},
      FirstTokenMsg{5, 42, {-0.25f, {{42, -0.25f}}}, std::string("st\0ate", 6)},
      ev,
      AbortMsg{5, "client gone"},
      DrainMsg{1000},
      DeregisterMsg{"shutdown"},
      KvEventsMsg{true, 64, 256, {1, 0xffffffffffffffffull, 0}, {}},
      KvEventsMsg{false, 16, 32, {7}, {8, 9}},
      KvEventsMsg{false, 16, 32, {}, {}},
      KvPullMsg{5, std::string("d\0esc", 5), 128, 256, 0xabcdef},
      KvPushMsg{5, "chatcmpl-1", {1, 2, 3, 4}, 1, 3, std::string("d\0esc", 5), 0xabcdef},
      KvPushFailedMsg{5, "evicted"},
  };
  for (const auto& m : messages) {
    SCOPED_TRACE(ControlMessageName(m));
    EXPECT_EQ(RoundTrip(m), m);
  }
}

TEST(ControlCodecTest, PullFieldsAreChecked) {
  JobMsg job = SampleJob();
  job.phase = JobPhase::kPrefill;
  job.pull_tokens = static_cast<uint32_t>(job.prompt.size());
  job.pull_worker_id = "prefill-1";
  EXPECT_EQ(std::get<JobMsg>(RoundTrip(job)), job);
  job.pull_tokens = static_cast<uint32_t>(job.prompt.size()) + 1;
  EXPECT_EQ(EncodeControlMessage(job).status().code(), StatusCode::kInvalidArgument);
  // The tokens of a push must be exactly the prefix it names.
  EXPECT_EQ(EncodeControlMessage(KvPushMsg{5, "t", {1, 2, 3}, 1, 3, "d", 1}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(ControlCodecTest, OptionalSeedSurvives) {
  JobMsg j = SampleJob();
  j.sampling.seed.reset();
  EXPECT_EQ(std::get<JobMsg>(RoundTrip(j)).sampling.seed, std::nullopt);
}

TEST(ControlCodecTest, GarbageNeverCrashes) {
  EXPECT_EQ(DecodeControlMessage("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeControlMessage("abc").status().code(), StatusCode::kInvalidArgument);
  std::mt19937 rng(7);
  auto good = EncodeControlMessage(SampleJob()).value();
  int rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes;
    if (round % 2 == 0) {
      bytes.resize(8 * (1 + rng() % 64));
      for (auto& c : bytes) c = static_cast<char>(rng());
    } else {  // flip a few bytes of a valid message
      bytes = good;
      for (int k = 0; k < 4; ++k) bytes[rng() % bytes.size()] = static_cast<char>(rng());
    }
    auto r = DecodeControlMessage(bytes);
    if (!r.ok()) ++rejected;
  }
  EXPECT_GT(rejected, 0);
}

TEST(ControlCodecTest, RejectsBadValues) {
  {  // negative prompt token
    capnp::MallocMessageBuilder b;
    auto job = b.initRoot<proto::control::ControlMessage>().initJob();
    auto p = job.initPromptTokenIds(2);
    p.set(0, 1);
    p.set(1, -3);
    job.initSampling().setMaxTokens(1);
    auto words = capnp::messageToFlatArray(b);
    auto bytes = words.asBytes();
    auto r = DecodeControlMessage(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("negative"), std::string::npos);
  }
  {  // NaN temperature
    JobMsg j = SampleJob();
    j.sampling.temperature = std::nanf("");
    auto bytes = EncodeControlMessage(j).value();
    EXPECT_EQ(DecodeControlMessage(bytes).status().code(), StatusCode::kInvalidArgument);
  }
  {  // empty prompt, zero max tokens
    JobMsg j = SampleJob();
    j.prompt.clear();
    EXPECT_FALSE(DecodeControlMessage(EncodeControlMessage(j).value()).ok());
    j = SampleJob();
    j.sampling.max_tokens = 0;
    EXPECT_FALSE(DecodeControlMessage(EncodeControlMessage(j).value()).ok());
  }
  {  // empty worker id
    RegisterMsg r;
    EXPECT_FALSE(DecodeControlMessage(EncodeControlMessage(r).value()).ok());
  }
  {  // an unknown status code
    capnp::MallocMessageBuilder b;
    b.initRoot<proto::control::ControlMessage>().initTokenEvent().setErrorCode(999);
    auto words = capnp::messageToFlatArray(b);
    auto bytes = words.asBytes();
    EXPECT_FALSE(DecodeControlMessage(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size())).ok());
  }
  {  // logprobs not parallel to tokens: refused when encoding
    TokenEventMsg ev;
    ev.tokens = {1, 2};
    ev.logprobs = {{}};
    EXPECT_EQ(EncodeControlMessage(ev).status().code(), StatusCode::kInvalidArgument);
  }
  {  // limits are checked when encoding too
    JobMsg j = SampleJob();
    j.sampling.stop.assign(ControlLimits::kMaxStopStrings + 1, "x");
    EXPECT_EQ(EncodeControlMessage(j).status().code(), StatusCode::kInvalidArgument);
  }
}

TEST(ControlCodecTest, KvEventsNeedABlockSizeAndNoRemovalsInAReset) {
  EXPECT_EQ(EncodeControlMessage(KvEventsMsg{false, 0, 0, {1}, {}}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeControlMessage(KvEventsMsg{true, 16, 32, {1}, {2}}).status().code(), StatusCode::kInvalidArgument);
  KvEventsMsg big{false, 16, 32, {}, {}};
  big.stored.assign(ControlLimits::kMaxKvEventHashes + 1, 5);
  EXPECT_EQ(EncodeControlMessage(big).status().code(), StatusCode::kInvalidArgument);
  // The same rules when decoding what another sender built.
  for (const bool reset : {false, true}) {
    capnp::MallocMessageBuilder b;
    auto ev = b.initRoot<proto::control::ControlMessage>().initKvEvents();
    ev.setReset(reset);
    ev.setBlockTokens(reset ? 16 : 0);
    ev.initRemoved(1).set(0, 3);
    auto words = capnp::messageToFlatArray(b);
    auto bytes = words.asBytes();
    auto r = DecodeControlMessage(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("kvEvents"), std::string::npos) << r.status().ToString();
  }
}

TEST(ControlCodecTest, ErrorEventWithoutCodeStillFails) {
  capnp::MallocMessageBuilder b;
  b.initRoot<proto::control::ControlMessage>().initTokenEvent().setFinishReason(proto::control::FinishReason::ERROR);
  auto words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  auto r = DecodeControlMessage(std::string_view(reinterpret_cast<const char*>(bytes.begin()), bytes.size()));
  ASSERT_TRUE(r.ok());
  const auto& ev = std::get<TokenEventMsg>(r.value());
  EXPECT_TRUE(ev.finishing());
  EXPECT_EQ(ev.error.code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace pdserve::services
