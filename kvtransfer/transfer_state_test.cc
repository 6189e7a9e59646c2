#include "kvtransfer/transfer_state.h"

#include <gtest/gtest.h>

namespace pdserve::kvtransfer {
namespace {

TEST(TransferStateTest, OnlyTheDocumentedTransitionsAreValid) {
  using S = TransferState;
  const S all[] = {S::kReserved, S::kWriting, S::kComplete, S::kHandedOver, S::kAborted};
  int valid = 0;
  for (S from : all) {
    for (S to : all) valid += IsValidTransition(from, to) ? 1 : 0;
  }
  EXPECT_EQ(valid, 6);
  EXPECT_TRUE(IsValidTransition(S::kReserved, S::kWriting));
  EXPECT_TRUE(IsValidTransition(S::kWriting, S::kComplete));
  EXPECT_TRUE(IsValidTransition(S::kComplete, S::kHandedOver));
  EXPECT_TRUE(IsValidTransition(S::kComplete, S::kAborted));
  EXPECT_FALSE(IsValidTransition(S::kReserved, S::kComplete));
  EXPECT_FALSE(IsValidTransition(S::kAborted, S::kReserved));
  EXPECT_FALSE(IsValidTransition(S::kHandedOver, S::kAborted));
  EXPECT_TRUE(IsTerminal(S::kAborted));
  EXPECT_TRUE(IsTerminal(S::kHandedOver));
  EXPECT_FALSE(IsTerminal(S::kComplete));
  EXPECT_EQ(TransferStateName(S::kHandedOver), "handed_over");
}

}  // namespace
}  // namespace pdserve::kvtransfer
