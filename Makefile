# pdserve: the two commands a newcomer needs are `make demo` and `make test`.
# Both install what is missing (apt + npm), build, then run; both are quiet when already set up.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2

.PHONY: setup configure build test demo bench clean

setup:
	@scripts/setup.sh

configure: setup
	@scripts/configure.sh $(BUILD_DIR) $(BUILD_TYPE)

build: configure
	@scripts/build.sh $(BUILD_DIR) $(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) --timeout 900

demo: build
	@PDSERVE_DEMO_KEEP=$(if $(KEEP),1,0) scripts/demo.sh $(BUILD_DIR)

bench: build
	@scripts/bench.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR)
