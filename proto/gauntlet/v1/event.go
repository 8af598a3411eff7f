package gauntletv1

import "google.golang.org/protobuf/encoding/protowire"

// EpisodeEnd is the episode end an event carries, alone or on the segment that ends an
// episode; nil when it carries none.
func (e *Event) EpisodeEnd() *EpisodeEnded {
	if end := e.GetEnded(); end != nil {
		return end
	}
	return e.GetSteps().GetEnded()
}

// EpisodeStart is the episode start an event carries, alone or on an episode's first
// segment; nil when it carries none.
func (e *Event) EpisodeStart() *EpisodeStarted {
	if st := e.GetStarted(); st != nil {
		return st
	}
	return e.GetSteps().GetStarted()
}

// Events is what e stands for event by event: the events of its batch, or e itself.
func (e *Event) Events() []*Event {
	if b := e.GetBatch(); b != nil {
		return b.GetEvents()
	}
	return []*Event{e}
}

// AppendBatch appends the encoding of an Event whose body is an EventBatch of the events
// encoded in events (each an encoded Event), exactly what Marshal makes of that Event
// (TestAppendBatchMatchesMarshal), without walking the events' messages again: a worker
// encodes each episode's last segment when the episode ends and joins them when its
// assignment does.
func AppendBatch(dst []byte, events [][]byte) []byte {
	const (
		eventBatch = 5<<3 | 2 // Event.batch, length-delimited
		batchEvent = 1<<3 | 2 // EventBatch.events, length-delimited
	)
	inner := 0
	for _, e := range events {
		inner += 1 + protowire.SizeBytes(len(e))
	}
	dst = append(dst, eventBatch)
	dst = protowire.AppendVarint(dst, uint64(inner))
	for _, e := range events {
		dst = append(dst, batchEvent)
		dst = protowire.AppendBytes(dst, e)
	}
	return dst
}

// InfraErrorEnd is the end of assigned episode a recorded by whoever gave up on it without
// playing it to its end (workerID: a worker on an assignment's last delivery, or the
// scheduler for one that ran out of deliveries): truncated as an infra error, which
// trainers mask rather than punish, with what failed and why, at endedAt (unix
// nanoseconds). It carries no reward.
func (a *EpisodeAssigned) InfraErrorEnd(workerID string, kind InfraKind, why string, endedAt int64) *EpisodeEnded {
	return &EpisodeEnded{
		Episode: a.GetEpisode(), Profile: a.GetPlan().GetProfile(), Plan: a.GetPlan(), WorkerId: workerID,
		Truncated: true, Reason: TerminationReason_TERMINATION_REASON_INFRA_ERROR,
		InfraError: true, InfraKind: kind, Error: why, EndedAtUnixNano: endedAt,
	}
}
