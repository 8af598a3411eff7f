package ctrd

import "sync"

// Shim grouping.
//
// containerd starts one containerd-shim-runc-v2 process per task unless the task's OCI
// spec carries a group annotation: the shim's "start" command then finds the group's
// shim already listening on the socket derived from the group id and hands containerd
// that address instead of starting a second, long-lived shim process (the same
// mechanism CRI uses to run a pod's containers in one shim). That saves starting and
// connecting a Go daemon per sandbox.
//
// A grouped shim exits when its last task is deleted. A sandbox that joined the group
// just before must not reach the shim while it shuts down, so a group is used by new
// sandboxes only while it has live tasks: the delete that would empty it waits until
// no task of the group is being created, then seals the group, which is never joined
// again (a sealed group's id is never reused; the next sandbox starts a new group and
// a new shim). Groups hold at most SandboxesPerShim sandboxes.
//
// Sandboxes recovered from an earlier runtime keep their old shims; their groups are
// unknown to this runtime and never joined (group ids are random).

// shimGroupAnnotation is the runc v2 shim's grouping annotation.
const shimGroupAnnotation = "io.containerd.runc.v2.group"

// shimGroup is one shim's worth of sandboxes.
type shimGroup struct {
	id      string
	ns      uint64 // the mount namespace (inode number) its shim starts in: the daemon's
	pending int    // tasks being created in the group
	live    int    // tasks created and not yet being deleted
	sealed  bool   // the shim may be exiting: never join again
	// address is the running shim's socket address, once a start through the real shim
	// has told it (shimstart.go); "" until then.
	address string
}

// shimGroups assigns sandboxes to shim groups. The zero value is not usable: call init.
type shimGroups struct {
	mu     sync.Mutex
	cond   *sync.Cond // signalled when a group's pending count drops
	prefix string
	max    int
	open   *shimGroup            // the group new sandboxes join
	byID   map[string]*shimGroup // every group with pending or live tasks
}

func (s *shimGroups) init(prefix string, max int) {
	s.cond = sync.NewCond(&s.mu)
	s.prefix = prefix
	s.max = max
	s.byID = map[string]*shimGroup{}
}

// join picks the group for a task about to be created whose root filesystem needs the
// mount namespace ns (quota.go): a group whose shim runs in another one (started by a
// daemon since restarted) is not joined. created must follow.
func (s *shimGroups) join(ns uint64) *shimGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.open
	if g == nil || g.sealed || g.pending+g.live >= s.max || g.ns != ns {
		g = &shimGroup{id: "gauntlet-" + s.prefix + "-" + randomID(), ns: ns}
		s.open = g
		s.byID[g.id] = g
	}
	g.pending++
	return g
}

// created records the end of a task's creation in g: ok when the task exists in the
// shim. A failed creation seals the group (its shim may have been started for nothing
// and be exiting).
func (s *shimGroups) created(g *shimGroup, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g.pending--
	if ok {
		g.live++
	} else {
		g.sealed = true
	}
	s.forgetIfEmpty(g)
	s.cond.Broadcast()
}

// leave is called before a task of group id is deleted. When that task is the
// group's last, it waits for the group's pending creations and seals the group.
// Groups this runtime does not know (recovered sandboxes) are ignored.
func (s *shimGroups) leave(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.byID[id]
	if g == nil || g.live == 0 {
		return
	}
	for g.live == 1 && g.pending > 0 {
		s.cond.Wait()
	}
	g.live--
	if g.live == 0 {
		g.sealed = true
	}
	s.forgetIfEmpty(g)
}

func (s *shimGroups) forgetIfEmpty(g *shimGroup) {
	if g.sealed && g.pending == 0 && g.live == 0 {
		delete(s.byID, g.id)
		if s.open == g {
			s.open = nil
		}
	}
}

// address is g's shim address while new sandboxes may join g, else "".
func (s *shimGroups) address(g *shimGroup) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.sealed {
		return ""
	}
	return g.address
}

// setAddress records g's shim address, learnt from the start of one of its tasks.
func (s *shimGroups) setAddress(g *shimGroup, addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.address == "" {
		g.address = addr
	}
}
