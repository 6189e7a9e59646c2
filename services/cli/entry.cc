// pdserve: the command-line entry point (make-model, generate, tokenize, ...; services/cli/main.cc).
#include "common/heap_policy.h"
#include "services/cli/command.h"

int main(int argc, char** argv) {
  pdserve::ApplyHeapPolicy("pdserve");  // generate / batch-generate run the engine
  return pdserve::cli::Main(argc, argv);
}
