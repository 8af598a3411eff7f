// Package temporaltest starts a real Temporal dev server for a test, through the same
// launcher `gauntlet up` uses (pkg/temporallocal). When the server cannot start — the
// temporal binary is missing, a port cannot be had, it exits early — the test fails with
// the reason; it never skips.
package temporaltest
