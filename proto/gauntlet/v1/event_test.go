package gauntletv1

import (
	"bytes"
	"testing"
)

// AppendBatch joins encoded events into the very bytes Marshal makes of their batch, for
// none, one and many events, small and large (a length past one varint byte).
func TestAppendBatchMatchesMarshal(t *testing.T) {
	seg := func(ep string, steps int) *Event {
		st := &StepsTaken{Ended: &EpisodeEnded{Episode: &EpisodeRequested{EpisodeId: ep, RunId: "r1"}, Steps: uint32(steps)}}
		for i := range steps {
			st.Steps = append(st.Steps, &StepTaken{EpisodeId: ep, Step: uint32(i), ObservationJson: `{"ok":true,"sku":"sku-1"}`})
		}
		return &Event{Body: &Event_Steps{Steps: st}}
	}
	for _, evs := range [][]*Event{
		nil,
		{seg("e1", 1)},
		{seg("e1", 7), seg("e2", 3), {Body: &Event_Ended{Ended: &EpisodeEnded{Episode: &EpisodeRequested{EpisodeId: "e3"}}}}},
		{seg("e1", 300), seg("e2", 40)},
	} {
		var encoded [][]byte
		for _, ev := range evs {
			b, err := Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			encoded = append(encoded, b)
		}
		want, err := Marshal(&Event{Body: &Event_Batch{Batch: &EventBatch{Events: evs}}})
		if err != nil {
			t.Fatal(err)
		}
		if got := AppendBatch(nil, encoded); !bytes.Equal(got, want) {
			t.Errorf("%d events: AppendBatch gives %d bytes, Marshal %d", len(evs), len(got), len(want))
		}
	}
}
