package gauntletv1

import (
	"errors"

	"google.golang.org/protobuf/encoding/protowire"
)

// UnmarshalStepsInBlocks decodes data, an encoded Event, into ev as UnmarshalAliasing
// does (strings share data's memory), except that the steps of its segments (alone or
// in a batch) are allocated in blocks: the StepTaken messages of the whole event in one
// array, and their action, metering, signals and score in one array each, where the
// generated decoder makes five allocations per step. Each step then has all four of
// those messages, empty when the wire had none: read them through their getters, which
// give the same values either way (the store does). Events without segments, and
// segments with fields this decoder does not know, are decoded by the generated code.
func UnmarshalStepsInBlocks(data []byte, ev *Event) error {
	n, err := countSegmentSteps(data, true)
	if err != nil || n == 0 {
		return UnmarshalAliasing(data, ev)
	}
	b := &stepBlocks{
		steps:    make([]StepTaken, n),
		actions:  make([]Action, n),
		metering: make([]Metering, n),
		signals:  make([]Signals, n),
		scores:   make([]StepScored, n),
	}
	ev.Reset()
	return b.event(data, ev, true)
}

// stepBlocks holds the arrays one event's steps are decoded into.
type stepBlocks struct {
	steps    []StepTaken
	actions  []Action
	metering []Metering
	signals  []Signals
	scores   []StepScored
	next     int
}

var errNotBlocked = errors.New("not a segment this decoder reads")

// event decodes an Event whose body is a segment or (when batch) a batch of events; any
// other event it hands to the generated decoder.
func (b *stepBlocks) event(data []byte, ev *Event, batch bool) error {
	err := eachField(data, func(num protowire.Number, v []byte) error {
		switch {
		case ev.Body != nil:
			return errNotBlocked // a second body: the generated decoder merges
		case num == 4:
			seg := &StepsTaken{}
			if err := b.segment(v, seg); err != nil {
				return err
			}
			ev.Body = &Event_Steps{Steps: seg}
		case num == 5 && batch:
			eb := &EventBatch{}
			if err := eachField(v, func(num protowire.Number, v []byte) error {
				if num != 1 {
					return errNotBlocked
				}
				e := &Event{}
				if err := b.event(v, e, false); err != nil {
					return err
				}
				eb.Events = append(eb.Events, e)
				return nil
			}); err != nil {
				return err
			}
			ev.Body = &Event_Batch{Batch: eb}
		default:
			return errNotBlocked
		}
		return nil
	})
	if errors.Is(err, errNotBlocked) {
		ev.Reset()
		return ev.UnmarshalVTUnsafe(data)
	}
	return err
}

// segment decodes a StepsTaken, its steps from the blocks.
func (b *stepBlocks) segment(data []byte, seg *StepsTaken) error {
	err := eachField(data, func(num protowire.Number, v []byte) error {
		switch num {
		case 1:
			if b.next == len(b.steps) {
				return errNotBlocked // more steps than counted: not the message counted
			}
			i := b.next
			b.next++
			st := &b.steps[i]
			st.Action, st.Metering, st.Signals, st.Score = &b.actions[i], &b.metering[i], &b.signals[i], &b.scores[i]
			seg.Steps = append(seg.Steps, st)
			return st.UnmarshalVTUnsafe(v)
		case 2:
			if seg.Started != nil {
				return errNotBlocked // repeated: the generated decoder merges
			}
			seg.Started = &EpisodeStarted{}
			return seg.Started.UnmarshalVTUnsafe(v)
		case 3:
			if seg.Ended != nil {
				return errNotBlocked
			}
			seg.Ended = &EpisodeEnded{}
			return seg.Ended.UnmarshalVTUnsafe(v)
		case 4:
			sp := &ScoreSpec{}
			seg.ScoreSpecs = append(seg.ScoreSpecs, sp)
			return sp.UnmarshalVTUnsafe(v)
		}
		return errNotBlocked
	})
	if errors.Is(err, errNotBlocked) {
		seg.Reset()
		return seg.UnmarshalVTUnsafe(data)
	}
	return err
}

// countSegmentSteps counts the steps of the segments of an encoded Event (and, when
// batch, of the events of its batch).
func countSegmentSteps(data []byte, batch bool) (int, error) {
	n := 0
	err := eachField(data, func(num protowire.Number, v []byte) error {
		switch {
		case num == 4:
			return eachField(v, func(num protowire.Number, _ []byte) error {
				if num == 1 {
					n++
				}
				return nil
			})
		case num == 5 && batch:
			return eachField(v, func(num protowire.Number, ev []byte) error {
				if num != 1 {
					return nil
				}
				k, err := countSegmentSteps(ev, false)
				n += k
				return err
			})
		}
		return nil
	})
	return n, err
}

// eachField calls fn with the number and contents of every length-delimited field of the
// encoded message data; a field of another wire type is errNotBlocked.
func eachField(data []byte, fn func(num protowire.Number, v []byte) error) error {
	return ScanFields(data, func(num protowire.Number, typ protowire.Type, v []byte) error {
		if typ != protowire.BytesType {
			return errNotBlocked
		}
		return fn(num, v)
	})
}

// ScanFields calls fn for every field of the encoded message data, with the contents of
// length-delimited fields as v.
func ScanFields(data []byte, fn func(num protowire.Number, typ protowire.Type, v []byte) error) error {
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		var v []byte
		if typ == protowire.BytesType {
			v, n = protowire.ConsumeBytes(data)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, data)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		data = data[n:]
		if err := fn(num, typ, v); err != nil {
			return err
		}
	}
	return nil
}
