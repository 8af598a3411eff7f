package shop

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
)

// BenchmarkOracleEpisode runs whole oracle episodes without faults (Reset included) and
// reports env steps per second of one goroutine.
func BenchmarkOracleEpisode(b *testing.B) {
	benchEpisodes(b, func(uint64) env.Config { return env.Config{} })
}

// BenchmarkOracleEpisodeFaults is BenchmarkOracleEpisode under the stress fault plan.
func BenchmarkOracleEpisodeFaults(b *testing.B) {
	benchEpisodes(b, func(seed uint64) env.Config { return env.Config{Faults: stressPlan(b, seed)} })
}

func benchEpisodes(b *testing.B, mk func(seed uint64) env.Config) {
	b.ReportAllocs()
	envtest.BenchOracle(b, New(), mk)
}
