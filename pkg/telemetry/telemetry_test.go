package telemetry

import (
	"context"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Spans are recorded, and written, only with a trace file; counters reach /metrics either
// way, labelled through Label.
func TestSpansOnlyWithATraceFile(t *testing.T) {
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "spans.json")
	for _, traceFile := range []string{"", file} {
		tel, err := New("test", traceFile)
		if err != nil {
			t.Fatal(err)
		}
		_, span := tel.Tracer("t").Start(ctx, "episode")
		if recording := span.IsRecording(); recording != (traceFile != "") {
			t.Errorf("trace file %q: span recording = %v", traceFile, recording)
		}
		span.End()
		c := Must(tel.Meter("t").Int64Counter("gauntlet_test_total"))
		c.Add(ctx, 3, NewLabel("kind").Option("latency"))
		rec := httptest.NewRecorder()
		tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		if !strings.Contains(rec.Body.String(), `gauntlet_test_total{kind="latency"} 3`) {
			t.Errorf("trace file %q: /metrics lacks the counter:\n%s", traceFile, rec.Body.String())
		}
		if err := tel.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(file)
	if err != nil || !strings.Contains(string(b), `"Name":"episode"`) {
		t.Errorf("trace file holds %q (%v), want the episode span", b, err)
	}
}
