package scheduler

// Snapshot is what an admission decision looks at: one run's counters and the
// scheduler-wide load. Decisions are pure functions of it, testable without NATS.
type Snapshot struct {
	Episodes    uint64 // the run's size
	Assigned    uint64 // episodes of the run assigned so far
	Ended       uint64 // episodes of the run ended (de-duplicated)
	MaxInFlight uint64 // the run's cap on episodes in flight
	// GlobalInFlight and GlobalMax are the scheduler-wide count and cap.
	GlobalInFlight uint64
	GlobalMax      uint64
	// Batch caps one decision, so no run starves the others of plan requests.
	Batch uint64
}

// Admit returns how many more episodes of the run to assign now: never past the run's
// size, the run's in-flight cap, the scheduler-wide cap, or one batch.
func Admit(s Snapshot) uint64 {
	if s.Assigned >= s.Episodes {
		return 0
	}
	n := s.Episodes - s.Assigned
	inFlight := s.Assigned - min(s.Ended, s.Assigned)
	if inFlight >= s.MaxInFlight {
		return 0
	}
	n = min(n, s.MaxInFlight-inFlight)
	if s.GlobalInFlight >= s.GlobalMax {
		return 0
	}
	n = min(n, s.GlobalMax-s.GlobalInFlight)
	return min(n, s.Batch)
}
