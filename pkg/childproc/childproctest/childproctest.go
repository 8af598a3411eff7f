// Package childproctest holds what the test starters of local servers (chtest,
// ctrdtest, temporaltest) share: a logger that reports a launcher's warnings through
// t.Log, so passing tests stay quiet and failing ones say what the server did.
package childproctest

import (
	"log/slog"
	"testing"
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
