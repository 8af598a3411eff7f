// Package rng owns gauntlet's deterministic randomness.
//
// Every random choice in an episode comes from a generator keyed by the episode seed, the
// component that draws (a fault id, "policy", "world"), and a counter, never from a global
// source or the host clock. Two runs with the same keys draw the same numbers, on any
// machine, whatever the goroutine timing. Generators are not safe for concurrent use; each
// owner keeps its own.
package rng

import (
	"math/rand/v2"
)

// Derive mixes a seed with labels into a new 64-bit seed. Derive(s, "a", "b") is stable
// across processes and versions of Go; it is how child seeds (episode seeds from a run
// seed, component seeds from an episode seed) are made.
func Derive(seed uint64, labels ...string) uint64 {
	// FNV-1a over the seed's 8 little-endian bytes, then each label after a 0 separator
	// (so ("ab","c") differs from ("a","bc")), written out so that it allocates nothing:
	// fault evaluation derives a seed per draw. Identical to hash/fnv's New64a.
	h := uint64(fnvOffset)
	for i := 0; i < 8; i++ {
		h = (h ^ (seed >> (8 * i) & 0xff)) * fnvPrime
	}
	for _, l := range labels {
		h *= fnvPrime // the separator byte 0: xor with 0 is a no-op
		for i := 0; i < len(l); i++ {
			h = (h ^ uint64(l[i])) * fnvPrime
		}
	}
	return mix(h)
}

// FNV-1a 64-bit parameters.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

// DeriveN is Derive with a numeric label, for indices and counters.
func DeriveN(seed uint64, label string, n uint64) uint64 {
	return mix(Derive(seed, label) ^ mix(n+0x9e3779b97f4a7c15))
}

// New returns a generator keyed by (seed, component, counter).
func New(seed uint64, component string, counter uint64) *rand.Rand {
	s := DeriveN(seed, component, counter)
	return rand.New(rand.NewPCG(s, mix(s^0x94d049bb133111eb)))
}

// Reseed resets p to the state New(seed, component, counter) starts from, so a caller
// that needs many short keyed streams can reuse one generator instead of allocating one
// per stream. rand.New(p) then draws exactly what New's generator draws.
func Reseed(p *rand.PCG, seed uint64, component string, counter uint64) {
	s := DeriveN(seed, component, counter)
	p.Seed(s, mix(s^0x94d049bb133111eb))
}

// Float64 returns the single uniform draw in [0,1) keyed by (seed, component, counter),
// without allocating a generator: the hot path of fault evaluation.
func Float64(seed uint64, component string, counter uint64) float64 {
	return float64(DeriveN(seed, component, counter)>>11) / (1 << 53)
}

// mix is SplitMix64's finaliser: it spreads every input bit over the output.
func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
