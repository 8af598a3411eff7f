package faults

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// SetGlobalDrift validates set and stores it as the global drift every planner applies to
// every episode planned from now on, stamping set_at when it is zero. The bucket keeps each
// revision, so the change is recorded (see DriftHistory). It returns the KV revision. An
// empty set clears the global drift (and is recorded too).
func SetGlobalDrift(ctx context.Context, js jetstream.JetStream, set *gauntletv1.DriftSet) (uint64, error) {
	if err := plans.ValidateDrift(set.GetDrift()); err != nil {
		return 0, fmt.Errorf("set global drift: %w", err)
	}
	set = proto.Clone(set).(*gauntletv1.DriftSet)
	if set.SetAtUnixNano == 0 {
		set.SetAtUnixNano = time.Now().UnixNano()
	}
	kv, err := js.KeyValue(ctx, bus.BucketDrift)
	if err != nil {
		return 0, fmt.Errorf("set global drift: open bucket %s: %w", bus.BucketDrift, err)
	}
	data, err := proto.Marshal(set)
	if err != nil {
		return 0, fmt.Errorf("set global drift: %w", err)
	}
	rev, err := kv.Put(ctx, bus.KeyDriftGlobal, data)
	if err != nil {
		return 0, fmt.Errorf("set global drift: put %s/%s: %w", bus.BucketDrift, bus.KeyDriftGlobal, err)
	}
	return rev, nil
}

// GlobalDrift returns the global drift in force and its KV revision (0 and an empty set
// when none was ever set). A bucket that cannot be read (a timeout, NATS down) is
// errkind.Unavailable; a stored value that is not a valid drift set is errkind.Invalid.
func GlobalDrift(ctx context.Context, js jetstream.JetStream) (*gauntletv1.DriftSet, uint64, error) {
	kv, err := js.KeyValue(ctx, bus.BucketDrift)
	if err != nil {
		return nil, 0, errkind.E(errkind.Unavailable, fmt.Errorf("global drift: open bucket %s: %w", bus.BucketDrift, err))
	}
	e, err := kv.Get(ctx, bus.KeyDriftGlobal)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return &gauntletv1.DriftSet{}, 0, nil
	}
	if err != nil {
		return nil, 0, errkind.E(errkind.Unavailable, fmt.Errorf("global drift: get %s/%s: %w", bus.BucketDrift, bus.KeyDriftGlobal, err))
	}
	set, err := decodeDriftSet(e.Value())
	if err != nil {
		return nil, 0, errkind.E(errkind.Invalid, err)
	}
	return set, e.Revision(), nil
}

// DriftChange is one recorded revision of the global drift.
type DriftChange struct {
	Revision uint64
	Set      *gauntletv1.DriftSet
}

// DriftHistory returns the recorded revisions of the global drift, oldest first (the
// bucket keeps the last 64).
func DriftHistory(ctx context.Context, js jetstream.JetStream) ([]DriftChange, error) {
	kv, err := js.KeyValue(ctx, bus.BucketDrift)
	if err != nil {
		return nil, fmt.Errorf("drift history: open bucket %s: %w", bus.BucketDrift, err)
	}
	entries, err := kv.History(ctx, bus.KeyDriftGlobal)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("drift history: %w", err)
	}
	out := make([]DriftChange, 0, len(entries))
	for _, e := range entries {
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		set, err := decodeDriftSet(e.Value())
		if err != nil {
			return nil, err
		}
		out = append(out, DriftChange{Revision: e.Revision(), Set: set})
	}
	return out, nil
}

func decodeDriftSet(data []byte) (*gauntletv1.DriftSet, error) {
	var set gauntletv1.DriftSet
	if err := proto.Unmarshal(data, &set); err != nil {
		return nil, fmt.Errorf("global drift: decode %s/%s: %w", bus.BucketDrift, bus.KeyDriftGlobal, err)
	}
	// A set stored by an older or foreign writer is checked again: a planner must never
	// apply an invalid value.
	if err := plans.ValidateDrift(set.Drift); err != nil {
		return nil, fmt.Errorf("global drift in %s/%s is invalid: %w", bus.BucketDrift, bus.KeyDriftGlobal, err)
	}
	return &set, nil
}
