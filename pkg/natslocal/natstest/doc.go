// Package natstest starts a throwaway local NATS JetStream cluster (pkg/natslocal) for
// tests of other packages.
//
// [Start] builds the server binary through scripts/nats-server.sh (idempotent: a no-op
// once built) and starts the cluster in the test's temporary directory; cleanup kills it
// when the test ends. A machine without Go's module cache for the server fails the test
// with the reason, never skips it.
package natstest
