package faults

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// maxPut bounds the template ids a templateWriter remembers having put; past it the
// memory starts over (a repeated put is harmless). A template is one per (user-defined
// profile, catalogue version), so this is far above real use.
const maxPut = 4096

// templateWriter puts user-defined profiles' plan templates in the gauntlet_plan_templates
// KV bucket. The faults service owns the bucket: it alone writes it, before it hands out
// the first compact plan naming a template, and every other process only reads it
// (pkg/faults/templates.Client). It is safe for concurrent use.
type templateWriter struct {
	bucket *bus.Bucket

	mu  sync.Mutex
	put map[string]bool // ids this process has put
}

func newTemplateWriter(js jetstream.JetStream) *templateWriter {
	return &templateWriter{bucket: bus.NewBucket(js, bus.BucketPlanTemplates), put: make(map[string]bool)}
}

func (w *templateWriter) done(id string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.put[id]
}

// Put stores template t under id, its plans.NewTemplate id, unless this writer already
// has. Templates are content-addressed, so putting one twice is harmless.
func (w *templateWriter) Put(ctx context.Context, id string, t *gauntletv1.FaultPlan) error {
	if w.done(id) {
		return nil
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(t)
	if err != nil {
		return fmt.Errorf("put plan template %s: %w", id, err)
	}
	kv, err := w.bucket.KV(ctx)
	if err != nil {
		return fmt.Errorf("put plan template %s: %w", id, err)
	}
	if _, err := kv.Put(ctx, id, data); err != nil {
		return fmt.Errorf("put plan template %s: %w", id, err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.put) >= maxPut {
		clear(w.put)
	}
	w.put[strings.Clone(id)] = true
	return nil
}
