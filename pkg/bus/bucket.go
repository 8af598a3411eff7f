package bus

import (
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
)

// Bucket is a KV bucket opened on first use and kept open: EnsureStreams creates the
// buckets, but a reader or writer built before that (or before its connection exists)
// must not open them in its constructor. A failed open is retried on the next call.
// Safe for concurrent use.
type Bucket struct {
	js   jetstream.JetStream
	name string

	mu sync.Mutex
	kv jetstream.KeyValue
}

// NewBucket returns the bucket name of js, not yet opened.
func NewBucket(js jetstream.JetStream, name string) *Bucket {
	return &Bucket{js: js, name: name}
}

// KV opens the bucket the first time and returns it.
func (b *Bucket) KV(ctx context.Context) (jetstream.KeyValue, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.kv != nil {
		return b.kv, nil
	}
	kv, err := b.js.KeyValue(ctx, b.name)
	if err != nil {
		return nil, fmt.Errorf("open kv bucket %s: %w", b.name, err)
	}
	b.kv = kv
	return kv, nil
}
