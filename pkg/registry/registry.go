// Package registry holds named implementations that register themselves at init time
// (envs, policies). Register panics on a duplicate name — a programming error that shows
// at start-up, never at run time; Lookup's error names the known entries. A Registry is
// safe for concurrent use.
package registry

import (
	"fmt"
	"sort"
	"sync"
)

// Registry maps names to values of one kind.
type Registry[T any] struct {
	kind    string
	unknown error
	mu      sync.RWMutex
	items   map[string]T
}

// New returns an empty registry; kind names it in panics ("env"), unknown is wrapped by
// Lookup's error for a missing name.
func New[T any](kind string, unknown error) *Registry[T] {
	return &Registry[T]{kind: kind, unknown: unknown, items: map[string]T{}}
}

// Register adds v under name.
func (r *Registry[T]) Register(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.items[name]; dup {
		panic(r.kind + ": duplicate registration of " + name)
	}
	r.items[name] = v
}

// Lookup returns the value registered under name.
func (r *Registry[T]) Lookup(name string) (T, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.items[name]
	if !ok {
		return v, fmt.Errorf("%w %q (known: %v)", r.unknown, name, r.namesLocked())
	}
	return v, nil
}

// Names lists the registered names, sorted.
func (r *Registry[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.namesLocked()
}

func (r *Registry[T]) namesLocked() []string {
	out := make([]string, 0, len(r.items))
	for n := range r.items {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
