package bus

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// StoreBucket opens BucketStore, where the store publishes what it has written; nil (and
// no error) on a stack created before the bucket existed.
func (b *Bus) StoreBucket(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := b.JS.KeyValue(ctx, BucketStore)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open kv %s: %w", BucketStore, err)
	}
	return kv, nil
}

// PutStoreProgress publishes in kv (BucketStore) that every event of GAUNTLET_EVENTS up to
// stream sequence writtenSeq is in ClickHouse. Only the store calls it.
func PutStoreProgress(ctx context.Context, kv jetstream.KeyValue, writtenSeq uint64) error {
	data, err := gauntletv1.Marshal(&gauntletv1.StoreProgress{WrittenSeq: writtenSeq, UpdatedAtUnixNano: time.Now().UnixNano()})
	if err != nil {
		return fmt.Errorf("encode store progress: %w", err)
	}
	if _, err := kv.Put(ctx, KeyStoreWritten, data); err != nil {
		return fmt.Errorf("put %s/%s: %w", BucketStore, KeyStoreWritten, err)
	}
	return nil
}

// GetStoreProgress reads what the store last published in kv (BucketStore); nil (and no
// error) when no store has published yet.
func GetStoreProgress(ctx context.Context, kv jetstream.KeyValue) (*gauntletv1.StoreProgress, error) {
	e, err := kv.Get(ctx, KeyStoreWritten)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get %s/%s: %w", BucketStore, KeyStoreWritten, err)
	}
	var p gauntletv1.StoreProgress
	if err := gauntletv1.Unmarshal(e.Value(), &p); err != nil {
		return nil, fmt.Errorf("decode %s/%s: %w", BucketStore, KeyStoreWritten, err)
	}
	return &p, nil
}

// EventsLastSeq is the sequence of the last event GAUNTLET_EVENTS holds: once a run is
// done, each of its events is at or below it, so a store whose StoreProgress has reached
// it has written the whole run.
func (b *Bus) EventsLastSeq(ctx context.Context) (uint64, error) {
	st, err := b.JS.Stream(ctx, StreamEvents)
	if err != nil {
		return 0, fmt.Errorf("open stream %s: %w", StreamEvents, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("read stream %s: %w", StreamEvents, err)
	}
	return si.State.LastSeq, nil
}
