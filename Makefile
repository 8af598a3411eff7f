# gauntlet: `make demo` runs the whole thing end to end; `make test` runs every test.
SHELL := /bin/bash
GO    ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
BIN   := bin/gauntlet
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
export PATH := $(GOBIN):$(PATH)

.PHONY: help deps build test test-short lint proto proto-check demo up bench bench-check bench-baseline loadtest clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## install what is missing (Debian packages, pinned Go tools); idempotent
	@bash scripts/deps.sh

build: ## build bin/gauntlet
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/gauntlet

# -timeout is per package: cmd/gauntlet's end-to-end tests take about 15 minutes on a quiet
# 2-core machine, and more when it is shared.
test: deps ## the whole suite against real NATS and ClickHouse (race detector on)
	$(GO) vet ./... ./loadtest/...
	bash scripts/gotest.sh -race -count=1 -timeout 30m ./... ./loadtest/...

test-short: ## unit tests only: starts no ClickHouse, Temporal or containerd
	$(GO) test -short ./...

lint: deps proto-check ## gofmt, go vet, staticcheck, generated code up to date
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./... ./loadtest/...
	staticcheck ./... ./loadtest/...

proto: deps ## regenerate proto/ Go code with pinned protoc, protoc-gen-go, protoc-gen-connect-go and protoc-gen-go-vtproto
	protoc --go_out=. --go_opt=module=github.com/gauntlet-rl/gauntlet --connect-go_out=. --connect-go_opt=module=github.com/gauntlet-rl/gauntlet \
		--go-vtproto_out=. --go-vtproto_opt=module=github.com/gauntlet-rl/gauntlet,features=marshal+unmarshal+size+unmarshal_unsafe \
		proto/gauntlet/v1/*.proto

proto-check: proto ## fail when the committed generated code is stale
	@git diff --exit-code -- proto/ || { echo "proto/: generated code is stale; run make proto and commit"; exit 1; }

demo: deps build ## start the stack, run 20,000 shop episodes, print results, stop
	$(BIN) demo $(DEMO_FLAGS)

up: deps build ## run every service until Ctrl-C
	$(BIN) up

bench: deps ## Go micro-benchmarks of the hot paths
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/...

# The regression gate: the loadtest at a CI-sized count, judged by gauntlet's CPU per
# persisted step over the ClickHouse ceiling's CPU per row measured beside it (median over
# the rounds) against loadtest/baseline.json (same size, this machine kind); it fails
# beyond 1.5 times the baseline. `make bench-baseline` re-measures the baseline.
BENCH_CHECK_FLAGS := -rounds 3 -episodes 20000 -ceiling-steps 100000 -timeout 15m

bench-check: deps build ## fail if gauntlet's CPU per step (over the ceiling's) regressed beyond 1.5x its baseline
	cd loadtest && $(GO) run ./cmd/pipeline -gauntlet ../$(BIN) $(BENCH_CHECK_FLAGS) -baseline baseline.json -out results/bench-check.json

bench-baseline: deps build ## re-measure loadtest/baseline.json (commit it with the reason)
	cd loadtest && $(GO) run ./cmd/pipeline -gauntlet ../$(BIN) $(BENCH_CHECK_FLAGS) -write-baseline baseline.json -out results/bench-baseline.json

loadtest: deps build ## end-to-end throughput vs the ClickHouse ceiling (docs/benchmarks.md)
	cd loadtest && $(GO) run ./cmd/pipeline -gauntlet ../$(BIN) $(LOADTEST_FLAGS)

clean:
	rm -rf bin .gauntlet
