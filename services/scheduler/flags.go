package scheduler

import (
	"flag"
	"time"
)

// RegisterFlags declares the scheduler.* flags on fs with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Uint64Var(&c.MaxInFlight, "scheduler.max-in-flight", 20_000, "episodes in flight over all runs")
	fs.Uint64Var(&c.AssignBatch, "scheduler.assign-batch", 512, "most episodes assigned per run per round")
	fs.Uint64Var(&c.EpisodesPerAssignment, "scheduler.episodes-per-assignment", 16, "consecutive episodes per assignment message, leased and acked as one (1: one per message; lower it for long episodes)")
	fs.DurationVar(&c.ProgressEvery, "scheduler.progress-every", 250*time.Millisecond, "how often run progress is published")
}
