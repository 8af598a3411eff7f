package policy

// Set is the policies one process plays with: the registered ones, with configured
// instances (the "http" policy holding its endpoint) in place of the registered rows of
// the same name. Whoever builds agents is given a Set, so two configurations in one
// process (two test stacks, a CLI beside a server) never see each other's. A nil *Set is
// the registered policies alone. A Set is read-only once made and safe for concurrent use.
type Set struct {
	configured map[string]Policy
}

// NewSet returns the registered policies with configured in place of the rows of their
// names.
func NewSet(configured ...Policy) *Set {
	s := &Set{configured: make(map[string]Policy, len(configured))}
	for _, p := range configured {
		s.configured[p.Name()] = p
	}
	return s
}

// Lookup returns the named policy: the configured one if the set has it, otherwise the
// registered one; its error lists the known names.
func (s *Set) Lookup(name string) (Policy, error) {
	if s != nil {
		if p, ok := s.configured[name]; ok {
			return p, nil
		}
	}
	return Lookup(name)
}
