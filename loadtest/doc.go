// Package loadtest is the module of gauntlet's load-test harnesses; it holds no code of
// its own. cmd/pipeline measures end-to-end persisted steps/s against the store's
// ClickHouse ceiling and memory over long runs: see README.md and docs/benchmarks.md.
package loadtest
