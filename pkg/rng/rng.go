// Package rng owns gauntlet's deterministic randomness.
//
// Every random choice in an episode comes from a generator keyed by the episode seed, the
// component that draws (a fault id, "policy", "world"), and a counter, never from a global
// source or the host clock. Two runs with the same keys draw the same numbers, on any
// machine, whatever the goroutine timing. Generators are not safe for concurrent use; each
// owner keeps its own.
package rng

import (
	"encoding/binary"
	"hash/fnv"
	"math/rand/v2"
)

// Derive mixes a seed with labels into a new 64-bit seed. Derive(s, "a", "b") is stable
// across processes and versions of Go; it is how child seeds (episode seeds from a run
// seed, component seeds from an episode seed) are made.
func Derive(seed uint64, labels ...string) uint64 {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	for _, l := range labels {
		h.Write([]byte{0}) // separator: ("ab","c") must differ from ("a","bc")
		h.Write([]byte(l))
	}
	return mix(h.Sum64())
}

// DeriveN is Derive with a numeric label, for indices and counters.
func DeriveN(seed uint64, label string, n uint64) uint64 {
	return mix(Derive(seed, label) ^ mix(n+0x9e3779b97f4a7c15))
}

// New returns a generator keyed by (seed, component, counter).
func New(seed uint64, component string, counter uint64) *rand.Rand {
	s := DeriveN(seed, component, counter)
	return rand.New(rand.NewPCG(s, mix(s^0x94d049bb133111eb)))
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
