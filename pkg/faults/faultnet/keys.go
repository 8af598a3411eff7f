package faultnet

import (
	"strconv"
	"sync"
)

// keyCounter numbers the streams of a prefix: "<prefix>/0", "<prefix>/1", ...
type keyCounter struct {
	mu sync.Mutex
	n  map[string]uint64
}

func (c *keyCounter) next(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]uint64{}
	}
	k := prefix + "/" + strconv.FormatUint(c.n[prefix], 10)
	c.n[prefix]++
	return k
}
