// Package templates is the reading side of the faults service's plan templates: the
// templates of user-defined profiles' fault plans, kept in the gauntlet_plan_templates KV
// bucket under their template id (pkg/faults/plans.NewTemplate). The faults service owns the
// bucket and alone writes it, before it hands out the first compact plan naming a
// template; workers, the env API and the store read a template through a Client when a
// compact plan names it (pkg/faults/plans.Expand) and keep it in memory, since a run has few.
// Services do not import each other, so this small library is what they share.
//
// A Client is safe for concurrent use.
package templates

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// maxCached bounds the templates a Client keeps; past it the cache starts over. A template
// is one per (user-defined profile, catalogue version), so this is far above real use.
const maxCached = 4096

// Client reads plan templates from the faults service's KV bucket, through a cache.
type Client struct {
	bucket *bus.Bucket

	mu     sync.Mutex
	cached map[string]*gauntletv1.FaultPlan // id → template, verified
}

// NewClient returns a Client over js, whose bucket bus.EnsureStreams created.
func NewClient(js jetstream.JetStream) *Client {
	return &Client{bucket: bus.NewBucket(js, bus.BucketPlanTemplates), cached: make(map[string]*gauntletv1.FaultPlan)}
}

func (s *Client) lookup(id string) *gauntletv1.FaultPlan {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cached[id]
}

func (s *Client) remember(id string, t *gauntletv1.FaultPlan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.cached) >= maxCached {
		clear(s.cached)
	}
	s.cached[strings.Clone(id)] = t // the id may share a message's memory
}

// Get returns the template with the given id, from the cache or the bucket, checked
// against its id.
func (s *Client) Get(ctx context.Context, id string) (*gauntletv1.FaultPlan, error) {
	if t := s.lookup(id); t != nil {
		return t, nil
	}
	kv, err := s.bucket.KV(ctx)
	if err != nil {
		return nil, fmt.Errorf("plan template %s: %w", id, err)
	}
	e, err := kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, fmt.Errorf("plan template %s: not in kv bucket %s (was it planned by this cluster's faults service?)", id, bus.BucketPlanTemplates)
	}
	if err != nil {
		return nil, fmt.Errorf("plan template %s: %w", id, err)
	}
	t := &gauntletv1.FaultPlan{}
	if err := proto.Unmarshal(e.Value(), t); err != nil {
		return nil, fmt.Errorf("plan template %s: decode: %w", id, err)
	}
	if _, got, err := plans.NewTemplate(t); err != nil || got != id {
		return nil, fmt.Errorf("plan template %s: content has id %s (%v)", id, got, err)
	}
	s.remember(id, t)
	return t, nil
}

// Expand is plans.Expand with the template p names, if any, got from the bucket.
func (s *Client) Expand(ctx context.Context, p *gauntletv1.FaultPlan, services []string) (*gauntletv1.FaultPlan, error) {
	var t *gauntletv1.FaultPlan
	if p.GetCompact() && p.GetTemplate() != "" {
		var err error
		if t, err = s.Get(ctx, p.GetTemplate()); err != nil {
			return nil, fmt.Errorf("expand plan: %w", err)
		}
	}
	return plans.Expand(p, services, t)
}
