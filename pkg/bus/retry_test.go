package bus

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// A cluster that has not heard from a peer yet refuses to place a stream on it ("peer
// offline"); EnsureStreams asks again instead of failing the process's start. A cluster
// with no room ("insufficient storage") is answered at once, for createStream to cap the
// stream.
func TestAPIRetryWaitsForAPeerNotHeardFrom(t *testing.T) {
	b := &Bus{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	offline := &jetstream.APIError{Code: 400, ErrorCode: errClusterNoPeers,
		Description: "no suitable peers for placement, peer offline"}
	calls := 0
	err := b.apiRetry(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return offline
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("apiRetry: %v after %d calls; want success at the third", err, calls)
	}

	full := &jetstream.APIError{Code: 400, ErrorCode: errClusterNoPeers,
		Description: "no suitable peers for placement, insufficient storage"}
	calls = 0
	err = b.apiRetry(context.Background(), func(context.Context) error {
		calls++
		return full
	})
	if !errors.Is(err, full) || calls != 1 {
		t.Fatalf("apiRetry: %v after %d calls; want the storage refusal at once", err, calls)
	}
}
