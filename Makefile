# gpulet: the two commands a user needs are `make demo` and `make test`.
# Both install the Debian 12 packages they need (apt-get; sudo when not root), configure and
# build in build/, then run.

BUILD      ?= build
BUILD_SAN  ?= build-san
BUILD_TSAN ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

DEB_PACKAGES := build-essential cmake ninja-build pkg-config git \
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libcpp-httplib-dev \
  lld-15 libssl-dev libgtest-dev libgmock-dev libbenchmark-dev \
  clang libclang-rt-14-dev prometheus slurmctld slurmd slurm-client munge \
  kubernetes-client procps python3 python3-yaml python3-dnspython iproute2 curl openssl libboost-dev \
  runc containernetworking-plugins busybox-static debootstrap

# Go for the real-cluster tier: /usr/local/go (go.dev's layout) before Debian's.
export PATH := /usr/local/go/bin:$(PATH)

SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: deps build build-san build-tsan demo test test-unit test-sanitize test-tsan bench clean format \
  cluster-bins cluster-up cluster-down

# Installs only what is missing, so a second run costs one dpkg query. kubectl may already come
# from another package (e.g. a cloud SDK's); any kubectl renders the manifests.
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do \
	  case $$p in kubernetes-client) command -v kubectl >/dev/null 2>&1 && continue;; esac; \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

$(BUILD_SAN)/build.ninja: | deps
	cmake -S . -B $(BUILD_SAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPULET_SANITIZE=ON $(CMAKE_ARGS)

build-san: deps $(BUILD_SAN)/build.ninja
	cmake --build $(BUILD_SAN) -j $(JOBS)

$(BUILD_TSAN)/build.ninja: | deps
	cmake -S . -B $(BUILD_TSAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPULET_TSAN=ON $(CMAKE_ARGS)

# Only the threaded components' unit tests are built here (GPULET_TSAN_TESTS in CMakeLists.txt).
build-tsan: deps $(BUILD_TSAN)/build.ninja
	cmake --build $(BUILD_TSAN) --target tsan_tests -j $(JOBS)

demo: build
	./scripts/demo.sh $(BUILD)

# The real-cluster tier (label "cluster", docs/real-cluster.md) needs upstream's components, built
# once per pinned version into a cache outside the clone (GPULET_CLUSTER_CACHE, default
# /var/cache/gpulet-cluster) with Go >= 1.26 from /usr/local/go or PATH.
test-unit: build cluster-bins
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

# The sanitizer build runs the unit and fault tests (label "sanitize").
test-sanitize: build-san
	cd $(BUILD_SAN) && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --output-on-failure -j $(JOBS) -L sanitize --timeout 600

# ThreadSanitizer over the threaded components: plugin, health, metrics, MPS, broker, k8s, common.
# Debian's gRPC and Abseil are not built with TSan: their internal synchronisation is invisible to
# it, so accesses made inside them are ignored (ignore_noninstrumented_modules); ours are checked.
test-tsan: build-tsan
	cd $(BUILD_TSAN) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1 \
	  ctest --output-on-failure -j $(JOBS) -L tsan --timeout 600

test: test-unit test-sanitize test-tsan

# Builds (or finds in the cache) kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kubectl, etcd, containerd, its runc shim and ctr. Without Go it says what to install; that stops
# the run only under CI=true (the cluster tests then skip, or fail under CI).
cluster-bins: deps
	@if ! command -v go >/dev/null 2>&1; then \
	  echo "cluster-bins: no Go toolchain: install Go >= 1.26 (the go.dev tarball into /usr/local/go);" \
	       "Debian 12's golang (1.19) cannot build Kubernetes 1.37"; \
	  [ "$$CI" != true ] || exit 1; \
	else t0=$$(date +%s); echo "cluster-bins: upstream components (testing/cluster/build.sh) ..."; \
	  ./testing/cluster/build.sh >/dev/null && \
	  echo "cluster-bins: ready in $$(( $$(date +%s) - t0 )) s"; fi

# A real single-node cluster left running for a person to use (docs/real-cluster.md).
cluster-up: build cluster-bins
	GPULET_BUILD_DIR=$(abspath $(BUILD)) ./testing/cluster/cluster.sh up --build $(abspath $(BUILD))
	@echo "cluster-up: point kubectl at it with: eval \"\$$(./testing/cluster/cluster.sh env)\""

cluster-down:
	./testing/cluster/cluster.sh down

bench: build
	./bench/run.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD_SAN)
