package bus_test

import (
	"context"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An event published again under its message id is acknowledged as a duplicate, and the
// publisher learns the sequence of the copy the stream keeps, which holds the first
// publish's content, not the second's.
func TestPublishTellsTheCopyKeptOfADuplicate(t *testing.T) {
	ctx := context.Background()
	b := bustest.Start(t)
	step := func(total float64) *gauntletv1.Event {
		return &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: []*gauntletv1.StepTaken{{
			EpisodeId: "r1-0000000", RunId: "r1", Step: 3, Score: &gauntletv1.StepScored{Total: total}}}}}}
	}
	var seqs []uint64
	p := bus.Patience{Duplicate: func(seq uint64) { seqs = append(seqs, seq) }}
	if err := b.PublishEventWith(ctx, step(1), p); err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 0 {
		t.Fatalf("a first publish reported as a duplicate of %v", seqs)
	}
	if err := b.PublishEventWith(ctx, step(2), p); err != nil {
		t.Fatal(err)
	}
	if len(seqs) != 1 || seqs[0] == 0 {
		t.Fatalf("duplicates reported: %v; want one, with the kept copy's sequence", seqs)
	}
	stream, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx, seqs[0])
	if err != nil {
		t.Fatal(err)
	}
	var ev gauntletv1.Event
	if err := gauntletv1.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	if got := ev.GetSteps().GetSteps()[0].GetScore().GetTotal(); got != 1 {
		t.Errorf("the kept copy scores %v; want the first publish's 1", got)
	}
}
