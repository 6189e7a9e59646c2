// pdserve: the command-line entry point (make-model, generate, tokenize, ...; services/cli/main.cc).
#include "services/cli/command.h"

int main(int argc, char** argv) { return pdserve::cli::Main(argc, argv); }
