package envapi

import (
	"flag"
	"time"
)

// RegisterFlags declares the envapi.* flags on fs with their defaults. DevTokenPath
// depends on the data dir and is filled in by whoever knows it.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "envapi.addr", "127.0.0.1:9470", "address of the env API, gRPC and HTTP/JSON on one port (empty: off)")
	fs.StringVar(&c.TokensFile, "envapi.tokens", "", "YAML file of tenants and their API tokens (empty: tenant \"default\", token in <data-dir>/envapi-token)")
	fs.IntVar(&c.MaxEpisodes, "envapi.max-episodes", 1024, "live episodes per tenant unless its entry says otherwise")
	fs.IntVar(&c.ServerMaxEpisodes, "envapi.server-max-episodes", 16384, "live env API episodes over all tenants")
	fs.DurationVar(&c.StepTimeout, "envapi.step-timeout", 30*time.Second, "bound on one step (env and reward)")
	fs.DurationVar(&c.StartTimeout, "envapi.start-timeout", 30*time.Second, "bound on a Reset (fault plan and env start)")
	fs.DurationVar(&c.EpisodeTimeout, "envapi.episode-timeout", time.Hour, "wall time from Reset after which an episode is truncated (reason timeout)")
	fs.DurationVar(&c.IdleTimeout, "envapi.idle-timeout", 5*time.Minute, "an episode with no call for this long is reaped (truncated, reason timeout)")
	fs.IntVar(&c.MaxConns, "envapi.max-conns", 4096, "connections the env API holds at once (more wait to be accepted)")
	fs.IntVar(&c.MaxConnsPerHost, "envapi.max-conns-per-host", 1024, "connections from one remote address (more are closed at once)")
	fs.IntVar(&c.MaxBatchBytes, "envapi.max-batch-bytes", 64<<20, "largest body of a batch call (StepBatch, Send, StepStream); larger ones are refused (413) before they are read")
	fs.DurationVar(&c.ReadTimeout, "envapi.read-timeout", 30*time.Second, "bound on reading one request, headers and body (not on the step it asks for)")
	fs.IntVar(&c.AuthFailures, "envapi.auth-failures", 20, "failed API tokens from one address within a minute after which the address is refused (0: never)")
	fs.DurationVar(&c.AuthBackoff, "envapi.auth-backoff", time.Minute, "how long an address is refused after --envapi.auth-failures failed tokens")
	fs.IntVar(&c.SegmentSteps, "envapi.segment-steps", 32, "steps of an env API episode per StepsTaken event")
	fs.IntVar(&c.ScoreBatch, "envapi.score-batch", 512, "most steps in one score request of the env API")
}
