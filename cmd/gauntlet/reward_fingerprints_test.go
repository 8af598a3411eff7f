package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
)

// reward fingerprints lists what players flag, as a table and as JSON lines, and
// --forget removes one.
func TestRewardFingerprints(t *testing.T) {
	b := bustest.Start(t)
	w := threats.NewWatcher(b.JS, noop.NewMeterProvider().Meter("test"), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	defer stop()
	go w.Run(rctx)
	f, ok := threats.Make("shell.exec", []byte(`{"command":"cat '/dev/mem'"}`), []string{"device_access: /dev/mem opened: a decoy, empty"})
	if !ok {
		t.Fatal("no fingerprint")
	}
	f.Episode, f.Step = "r1-0000007", 2
	w.Record(f)
	if err := w.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}

	var out bytes.Buffer
	if err := rewardFingerprints(ctx, b.JS, "", false, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"ID  ", f.ID, "shell.exec", "cat /dev/mem", "device_access", "r1-0000007 step 2", "(1 fingerprints)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := rewardFingerprints(ctx, b.JS, "", true, &out); err != nil {
		t.Fatal(err)
	}
	var got threats.Fingerprint
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got.ID != f.ID || got.Command != "cat /dev/mem" {
		t.Fatalf("json %q: %+v %v", out.String(), got, err)
	}
	out.Reset()
	if err := rewardFingerprints(ctx, b.JS, f.ID, false, &out); err != nil || !strings.Contains(out.String(), "forgotten") {
		t.Fatalf("forget: %v %q", err, out.String())
	}
	if err := rewardFingerprints(ctx, b.JS, f.ID, false, &out); !errors.Is(err, threats.ErrUnknown) {
		t.Errorf("forget twice: %v, want ErrUnknown", err)
	}
	out.Reset()
	if err := rewardFingerprints(ctx, b.JS, "", false, &out); err != nil || !strings.Contains(out.String(), "(0 fingerprints)") {
		t.Errorf("after forget: %v\n%s", err, out.String())
	}
}
