package gauntletv1

import (
	"testing"

	"google.golang.org/protobuf/proto"
)

// blockEvents are encoded events of every shape the store reads: a batch of segments
// with compact scores, a lone segment, a lone step, an end, and a segment whose steps
// lack some of their messages.
func blockEvents(t testing.TB) [][]byte {
	t.Helper()
	sparse := &Event{Body: &Event_Steps{Steps: &StepsTaken{Steps: []*StepTaken{
		{EpisodeId: "e3", Step: 0},
		{EpisodeId: "e3", Step: 1, Action: &Action{Tool: "catalog.search"}, Faults: []*FaultFired{{FaultId: "f", Kind: "latency"}}},
	}, Ended: &EpisodeEnded{Steps: 2}}}}
	var out [][]byte
	for _, ev := range []*Event{
		segmentEvent(),
		segmentEvent().GetBatch().GetEvents()[0],
		{Body: &Event_Step{Step: &StepTaken{EpisodeId: "e4", Signals: &Signals{Progress: 0.5}}}},
		{Body: &Event_Ended{Ended: &EpisodeEnded{Steps: 3, Success: true}}},
		sparse,
	} {
		data, err := Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// TestUnmarshalStepsInBlocksMatchesGenerated: the block decoder gives what the generated
// one gives, but for the empty messages it gives steps the wire had none of.
func TestUnmarshalStepsInBlocksMatchesGenerated(t *testing.T) {
	for i, data := range blockEvents(t) {
		var want, got Event
		if err := UnmarshalAliasing(data, &want); err != nil {
			t.Fatal(err)
		}
		if err := UnmarshalStepsInBlocks(data, &got); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if !proto.Equal(withoutEmptyParts(&got), withoutEmptyParts(&want)) {
			t.Errorf("event %d: blocks decoded\n%v\nthe generated decoder\n%v", i, &got, &want)
		}
	}
	// Every step of a segment has its four messages, from the blocks.
	var ev Event
	if err := UnmarshalStepsInBlocks(blockEvents(t)[4], &ev); err != nil {
		t.Fatal(err)
	}
	for _, st := range ev.GetSteps().GetSteps() {
		if st.Action == nil || st.Metering == nil || st.Signals == nil || st.Score == nil {
			t.Errorf("step %d: action %v, metering %v, signals %v, score %v: want all four", st.Step, st.Action, st.Metering, st.Signals, st.Score)
		}
	}
}

// FuzzUnmarshalStepsInBlocks: on any input the two decoders agree on whether it decodes
// and, when it does, on what it decodes to.
func FuzzUnmarshalStepsInBlocks(f *testing.F) {
	for _, data := range blockEvents(f) {
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want, got Event
		werr := UnmarshalAliasing(data, &want)
		gerr := UnmarshalStepsInBlocks(data, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("generated: %v, blocks: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(withoutEmptyParts(&got), withoutEmptyParts(&want)) {
			t.Fatalf("blocks decoded\n%v\nthe generated decoder\n%v", &got, &want)
		}
	})
}

// withoutEmptyParts returns a copy of ev whose steps have no empty action, metering,
// signals or score: the messages the block decoder gives every step.
func withoutEmptyParts(ev *Event) *Event {
	ev = proto.Clone(ev).(*Event)
	var segs []*StepsTaken
	if s := ev.GetSteps(); s != nil {
		segs = append(segs, s)
	}
	for _, e := range ev.GetBatch().GetEvents() {
		if s := e.GetSteps(); s != nil {
			segs = append(segs, s)
		}
	}
	var steps []*StepTaken
	for _, s := range segs {
		steps = append(steps, s.GetSteps()...)
	}
	if st := ev.GetStep(); st != nil {
		steps = append(steps, st)
	}
	for _, st := range steps {
		if st.Action != nil && proto.Size(st.Action) == 0 {
			st.Action = nil
		}
		if st.Metering != nil && proto.Size(st.Metering) == 0 {
			st.Metering = nil
		}
		if st.Signals != nil && proto.Size(st.Signals) == 0 {
			st.Signals = nil
		}
		if st.Score != nil && proto.Size(st.Score) == 0 {
			st.Score = nil
		}
	}
	return ev
}

// BenchmarkUnmarshalBatch decodes a batch of 16 segments of 5 and 3 steps each, with
// compact scores, the generated way and in blocks.
func BenchmarkUnmarshalBatch(b *testing.B) {
	var events []*Event
	for range 8 {
		events = append(events, segmentEvent().GetBatch().GetEvents()...)
	}
	for _, ev := range events { // as the shop's steps are
		for _, st := range ev.GetSteps().GetSteps() {
			st.Action = &Action{Tool: "catalog.search", ArgsJson: `{"query":"usb cable"}`}
			st.Metering = &Metering{ToolCalls: 1, VirtualNs: 105589642, WallNs: 2135, BytesIn: 26, BytesOut: 90}
			st.Signals = &Signals{Progress: 0.2, Budget: 31, DeadlineVirtualNs: 30e9, ProgressDelta: 0.2}
			st.Faults = []*FaultFired{{FaultId: "orders.latency", Kind: "latency", Target: "orders/order.create", Detail: "latency_ms=87.6"}}
		}
	}
	data, err := Marshal(&Event{Body: &Event_Batch{Batch: &EventBatch{Events: events}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		decode func([]byte, *Event) error
	}{{"generated", func(d []byte, ev *Event) error { return UnmarshalAliasing(d, ev) }}, {"blocks", UnmarshalStepsInBlocks}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var ev Event
				if err := c.decode(data, &ev); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
