// Package gauntletv1 is gauntlet's wire contract: every command, event and RPC body that
// crosses NATS, generated from gauntlet.proto by `make proto` (protoc and protoc-gen-go at
// pinned versions; CI fails when the generated code is stale). Hand-written helpers live in
// files not ending in .pb.go.
package gauntletv1
