package scheduler

import (
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A run counts its infra errors by what failed, from the ended events' kinds (read
// through EndedView), keeps the counts across a restart (its RunState), and reports them
// in its progress, where a curriculum's batch reads them.
func TestInfraErrorsCountedByKind(t *testing.T) {
	r := &run{spec: &gauntletv1.RunRequested{RunId: "r1", Episodes: 10}}
	r.Spec, _ = proto.Marshal(r.spec)
	ends := []*gauntletv1.EpisodeEnded{
		{InfraError: true, InfraKind: gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT},
		{InfraError: true, InfraKind: gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT},
		{InfraError: true, InfraKind: gauntletv1.InfraKind_INFRA_KIND_SANDBOX},
		{InfraError: true}, // a sender that predates kinds
		{Success: true},
		{InfraError: true, InfraKind: gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT}, // a duplicate of episode 0
	}
	for i, e := range ends {
		idx := uint64(i)
		if i == len(ends)-1 {
			idx = 0
		}
		e.Episode = &gauntletv1.EpisodeRequested{RunId: "r1", Index: idx}
		b, err := proto.Marshal(&gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: e}})
		if err != nil {
			t.Fatal(err)
		}
		var v gauntletv1.EndedView
		if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		r.record(v.GetEnded())
	}
	// Entry k counts InfraKind k: unspecified 1, gauntlet 0, model endpoint 2, sandbox 1.
	want := []uint64{1, 0, 2, 1}
	if r.InfraErrors != 4 || !slices.Equal(r.InfraByKind, want) {
		t.Fatalf("infra errors %d by kind %v, want 4 by %v", r.InfraErrors, r.InfraByKind, want)
	}
	p := r.progress()
	r.record(&gauntletv1.EndedSummary{Episode: &gauntletv1.EpisodeRef{Index: 7}, InfraError: true, InfraKind: gauntletv1.InfraKind_INFRA_KIND_SANDBOX})
	if !slices.Equal(p.GetInfraByKind(), want) {
		t.Errorf("progress by kind %v changed under a later end, want %v", p.GetInfraByKind(), want)
	}
	b, err := r.encode()
	if err != nil {
		t.Fatal(err)
	}
	back, _, err := decodeRun(b)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.progress().GetInfraByKind(); !slices.Equal(got, []uint64{1, 0, 2, 2}) {
		t.Errorf("after a restart: by kind %v, want [1 0 2 2]", got)
	}
	if st, err := gauntletv1.DecodeRunProgress(b); err != nil || !slices.Equal(st.GetInfraByKind(), []uint64{1, 0, 2, 2}) {
		t.Errorf("DecodeRunProgress: %v, %v", st.GetInfraByKind(), err)
	}
}
