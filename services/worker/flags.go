package worker

import (
	"flag"
	"time"
)

// RegisterFlags declares the worker's flags (worker.*) on fs with their defaults. The
// sandbox runtime's (sandbox.*) are the process's: every module that plays episodes shares
// one runtime.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.ID, "worker.id", "", "worker id in events (default: random)")
	fs.IntVar(&c.Concurrency, "worker.concurrency", 256, "episodes a worker runs at once")
	fs.IntVar(&c.ScoreBatch, "worker.score-batch", 512, "most steps in one score request")
	fs.IntVar(&c.ScoreRequests, "worker.score-requests", 2, "most score requests in flight at once (fewer carry more steps each)")
	fs.DurationVar(&c.AckWait, "worker.ack-wait", 30*time.Second, "lease on an assignment")
	fs.IntVar(&c.MaxDeliver, "worker.max-deliver", 3, "attempts per episode before it is an infra error")
	fs.IntVar(&c.SegmentSteps, "worker.segment-steps", 32, "steps of an episode per StepsTaken event")
}
