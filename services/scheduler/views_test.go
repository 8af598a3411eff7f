package scheduler

import (
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestEndedViewMatchesEvent checks that every field the scheduler's view declares has the
// same number, name and kind in the message it stands for, so the view decodes the real
// events; a field renumbered in one and not the other fails here. Message fields are
// checked through the pairs: each view message is listed with the message it stands for.
func TestEndedViewMatchesEvent(t *testing.T) {
	pairs := []struct{ view, full proto.Message }{
		{&gauntletv1.EndedView{}, &gauntletv1.Event{}},
		{&gauntletv1.SegmentEndView{}, &gauntletv1.StepsTaken{}},
		{&gauntletv1.EndedSummary{}, &gauntletv1.EpisodeEnded{}},
		{&gauntletv1.EpisodeRef{}, &gauntletv1.EpisodeRequested{}},
	}
	for _, p := range pairs {
		vd, fd := p.view.ProtoReflect().Descriptor(), p.full.ProtoReflect().Descriptor()
		fields := vd.Fields()
		for i := 0; i < fields.Len(); i++ {
			v := fields.Get(i)
			f := fd.Fields().ByNumber(v.Number())
			if f == nil {
				t.Errorf("%s.%s = %d: %s has no field %d", vd.Name(), v.Name(), v.Number(), fd.Name(), v.Number())
				continue
			}
			if f.Name() != v.Name() || f.Kind() != v.Kind() || f.Cardinality() != v.Cardinality() {
				t.Errorf("%s.%s (%v) differs from %s.%s (%v)", vd.Name(), v.Name(), v.Kind(), fd.Name(), f.Name(), f.Kind())
			}
		}
	}
}

// TestPassThroughViewsMatch checks the scheduler's pass-through messages against the
// messages they stand for: same numbers and names, with bytes standing for an encoded
// message; and that an assignment built from an encoded plan decodes as the original.
func TestPassThroughViewsMatch(t *testing.T) {
	for _, p := range []struct{ view, full proto.Message }{
		{&gauntletv1.PlanReplyPassThrough{}, &gauntletv1.PlanReply{}},
		{&gauntletv1.EpisodeAssignedPassThrough{}, &gauntletv1.EpisodeAssigned{}},
		{&gauntletv1.AssignmentPassThrough{}, &gauntletv1.Assignment{}},
	} {
		vd, fd := p.view.ProtoReflect().Descriptor(), p.full.ProtoReflect().Descriptor()
		if vd.Fields().Len() != fd.Fields().Len() {
			t.Errorf("%s has %d fields, %s %d", vd.Name(), vd.Fields().Len(), fd.Name(), fd.Fields().Len())
		}
		for i := 0; i < vd.Fields().Len(); i++ {
			v := vd.Fields().Get(i)
			f := fd.Fields().ByNumber(v.Number())
			if f == nil || f.Name() != v.Name() || f.Cardinality() != v.Cardinality() {
				t.Errorf("%s.%s has no counterpart in %s", vd.Name(), v.Name(), fd.Name())
				continue
			}
			encodedMessage := v.Kind() == protoreflect.BytesKind && f.Kind() == protoreflect.MessageKind
			if f.Kind() != v.Kind() && !encodedMessage {
				t.Errorf("%s.%s is %v, %s.%s %v", vd.Name(), v.Name(), v.Kind(), fd.Name(), f.Name(), f.Kind())
			}
		}
	}

	plan := &gauntletv1.FaultPlan{Profile: "edge", Seed: 42, Rules: []*gauntletv1.FaultRule{{Id: "r1", Target: "payment", Probability: 0.5}}}
	reply, err := proto.Marshal(&gauntletv1.PlanReply{Plans: []*gauntletv1.FaultPlan{plan}})
	if err != nil {
		t.Fatal(err)
	}
	var raw gauntletv1.PlanReplyPassThrough
	if err := proto.Unmarshal(reply, &raw); err != nil || len(raw.Plans) != 1 {
		t.Fatalf("pass-through reply: %v, %d plans", err, len(raw.Plans))
	}
	ep := &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1", Seed: 7}
	ep2 := &gauntletv1.EpisodeRequested{EpisodeId: "e2", RunId: "r1", Seed: 8}
	data, err := proto.Marshal(&gauntletv1.AssignmentPassThrough{Episodes: []*gauntletv1.EpisodeAssignedPassThrough{
		{Episode: ep, Plan: raw.Plans[0]}, {Episode: ep2, Plan: raw.Plans[0]}}})
	if err != nil {
		t.Fatal(err)
	}
	var got gauntletv1.Assignment
	if err := proto.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	want := &gauntletv1.Assignment{Episodes: []*gauntletv1.EpisodeAssigned{{Episode: ep, Plan: plan}, {Episode: ep2, Plan: plan}}}
	if !proto.Equal(&got, want) {
		t.Fatalf("assignment decoded as %v, want %v", &got, want)
	}
	if id := assignmentID(&gauntletv1.AssignmentPassThrough{Episodes: []*gauntletv1.EpisodeAssignedPassThrough{{Episode: ep}}}); id != "e1/assigned" {
		t.Errorf("id of a one-episode assignment: %q, want e1/assigned", id)
	}
	var pt gauntletv1.AssignmentPassThrough
	_ = proto.Unmarshal(data, &pt)
	if id := assignmentID(&pt); id != "e1..e2/assigned" {
		t.Errorf("id of a lot: %q, want e1..e2/assigned", id)
	}
}

func TestDecodeEnded(t *testing.T) {
	ended := &gauntletv1.EpisodeEnded{
		Episode: &gauntletv1.EpisodeRequested{EpisodeId: "e1", RunId: "r1", Index: 7, Env: "shop"},
		Steps:   2, InfraError: true, Success: true, TotalReward: 0.75, FaultsFired: 3,
		InfraKind: gauntletv1.InfraKind_INFRA_KIND_SANDBOX, Plan: &gauntletv1.FaultPlan{Profile: "edge"},
	}
	seg := &gauntletv1.StepsTaken{
		Started: &gauntletv1.EpisodeStarted{Episode: ended.Episode},
		Steps:   []*gauntletv1.StepTaken{{EpisodeId: "e1", RunId: "r1", Step: 0}, {EpisodeId: "e1", RunId: "r1", Step: 1}},
		Ended:   ended,
	}
	for name, ev := range map[string]*gauntletv1.Event{
		"lone end":    {Body: &gauntletv1.Event_Ended{Ended: ended}},
		"segment end": {Body: &gauntletv1.Event_Steps{Steps: seg}},
	} {
		data, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decodeEnded(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := &gauntletv1.EndedSummary{
			Episode: &gauntletv1.EpisodeRef{EpisodeId: "e1", RunId: "r1", Index: 7},
			Steps:   2, InfraError: true, Success: true, TotalReward: 0.75, FaultsFired: 3,
			InfraKind: gauntletv1.InfraKind_INFRA_KIND_SANDBOX,
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s: decoded %v, want %v", name, got, want)
		}
	}
	// The header the scheduler's headers-only consumer reads says the same.
	h, err := bus.EndedHeader(ended)
	if err != nil {
		t.Fatal(err)
	}
	got, err := bus.DecodeEndedHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	want := &gauntletv1.EndedSummary{
		Episode: &gauntletv1.EpisodeRef{EpisodeId: "e1", RunId: "r1", Index: 7},
		Steps:   2, InfraError: true, Success: true, TotalReward: 0.75, FaultsFired: 3,
		InfraKind: gauntletv1.InfraKind_INFRA_KIND_SANDBOX,
	}
	if !proto.Equal(got, want) {
		t.Errorf("header decoded as %v, want %v", got, want)
	}
	if n := want.ProtoReflect().Descriptor().Fields().Len(); n != 7 {
		t.Errorf("EndedSummary has %d fields; bus.EndedHeader and this test set 7", n)
	}
	if _, err := bus.DecodeEndedHeader("not base64!"); err == nil {
		t.Error("a garbled header decoded")
	}
	noEnd, _ := proto.Marshal(&gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: seg.Steps}}})
	if _, err := decodeEnded(noEnd); err == nil {
		t.Error("a segment without an end decoded as an end")
	}
	if _, err := decodeEnded([]byte{0xff, 0xff}); err == nil {
		t.Error("garbage decoded as an end")
	}
}
