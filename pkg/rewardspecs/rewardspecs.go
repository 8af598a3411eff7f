// Package rewardspecs is where the reward specs runs name travel: the gauntlet_reward_specs
// KV bucket, which holds each spec's file under its digest (pkg/scoring.Spec.Digest). Who
// submits a run puts its spec there first (Put) and names it by digest in the run; the
// reward service, to score a step of it, and the store, to record it once in the
// reward_specs table, read it back (Get), parse it, check it against its digest and keep it
// in memory, since a cluster has few specs. The built-in spec is never in the bucket: Get
// returns it from the binary. Services do not import each other, so this small library is
// what they share.
//
// A Client is safe for concurrent use.
package rewardspecs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
)

// maxCached bounds the specs a Client keeps; past it the cache starts over.
const maxCached = 1024

// ErrNotFound is wrapped by Get's error for a digest the bucket does not hold.
var ErrNotFound = errors.New("reward spec not found")

// Client puts and gets reward specs in the bucket, through a cache.
type Client struct {
	bucket *bus.Bucket

	mu     sync.Mutex
	cached map[string]scoring.Spec // digest → spec, parsed and checked
}

// NewClient returns a Client over js, whose bucket bus.EnsureStreams created.
func NewClient(js jetstream.JetStream) *Client {
	return &Client{bucket: bus.NewBucket(js, bus.BucketRewardSpecs), cached: make(map[string]scoring.Spec)}
}

// Key is the bucket key of a digest: KV keys allow no ':'.
func Key(digest string) string { return strings.Replace(digest, ":", "-", 1) }

// Put stores spec's file under its digest, unless it is there already (a digest names
// one file, so an existing entry is the same spec). The built-in spec is not stored.
func (c *Client) Put(ctx context.Context, spec scoring.Spec) error {
	if spec.Digest == "" || spec.Source == "" {
		return fmt.Errorf("put reward spec %s: not parsed from a file", spec.Version)
	}
	if spec.Digest == scoring.DefaultDigest() {
		return nil
	}
	kv, err := c.bucket.KV(ctx)
	if err != nil {
		return fmt.Errorf("put reward spec %s: %w", spec.Version, err)
	}
	if _, err := kv.Create(ctx, Key(spec.Digest), []byte(spec.Source)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("put reward spec %s (%s): %w", spec.Version, spec.Digest, err)
	}
	c.remember(spec.Digest, spec)
	return nil
}

// Get returns the spec with the given digest, from the binary (the built-in spec), the
// cache or the bucket, parsed and checked against its digest. A digest the bucket does
// not hold is ErrNotFound; a failing bucket is another error, worth a retry.
func (c *Client) Get(ctx context.Context, digest string) (scoring.Spec, error) {
	if digest == scoring.DefaultDigest() {
		return scoring.SpecFor(""), nil
	}
	if s, ok := c.lookup(digest); ok {
		return s, nil
	}
	kv, err := c.bucket.KV(ctx)
	if err != nil {
		return scoring.Spec{}, fmt.Errorf("reward spec %s: %w", digest, err)
	}
	e, err := kv.Get(ctx, Key(digest))
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return scoring.Spec{}, fmt.Errorf("reward spec %s: %w in kv bucket %s (was the run submitted with gauntlet run --reward-spec?)", digest, ErrNotFound, bus.BucketRewardSpecs)
	}
	if err != nil {
		return scoring.Spec{}, fmt.Errorf("reward spec %s: %w", digest, err)
	}
	s, err := scoring.Parse("reward spec "+digest, e.Value())
	if err != nil {
		return scoring.Spec{}, err
	}
	if s.Digest != digest {
		return scoring.Spec{}, fmt.Errorf("reward spec %s: the bucket's file has digest %s", digest, s.Digest)
	}
	c.remember(digest, s)
	return s, nil
}

func (c *Client) lookup(digest string) (scoring.Spec, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.cached[digest]
	return s, ok
}

func (c *Client) remember(digest string, s scoring.Spec) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.cached) >= maxCached {
		clear(c.cached)
	}
	c.cached[strings.Clone(digest)] = s // the digest may share a message's memory
}
