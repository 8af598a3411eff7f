package gauntletv1

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
