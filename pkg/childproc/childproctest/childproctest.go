// Package childproctest holds what the test starters of local servers (chtest,
// ctrdtest, temporaltest) share: starting a server for one test and ending it with the
// test, failing the test with the reason when it cannot start (never skipping), and a
// logger that reports a launcher's warnings through t.Log, so passing tests stay quiet
// and failing ones say what the server did.
package childproctest

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// Logger sends slog records at warning level and above to t.Log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// testWriter sends each write to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// Start starts a server for one test. start runs under a context bounded by timeout,
// logging through Logger(t); when it fails, t fails with the reason, prefixed by name.
// stop is registered with t.Cleanup, so it runs before the cleanups registered earlier
// (those of t.TempDir, say: the server is gone before its directory is removed); its
// error fails the test.
//
// Under -short (make test-short: unit tests only) the test is skipped, saying which server
// it needs: -short promises no ClickHouse, Temporal or containerd. The full suite (make
// test, CI) never runs with -short, so there nothing is skipped.
func Start[S any](t testing.TB, name string, timeout time.Duration, start func(ctx context.Context, log *slog.Logger) (S, error), stop func(S) error) S {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs a local server (%s); -short runs unit tests only", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	srv, err := start(ctx, Logger(t))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() {
		if err := stop(srv); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	return srv
}
